"""The user's source files a deployment's code depends on, and their digest: part of its
code version, so ``app-toolkit run --reload`` replaces a deployment when (and only when)
one of them changed (docs/deployments.md, "What a reload replaces").

The rule: a deployment's **roots** are the module of its class or function and, for an
HTTP ingress, the modules of its app's route endpoints, middleware and builder. From the
roots, every ``import`` statement in a module's source (at any depth: in functions too,
and ``if TYPE_CHECKING:``) that names one of the user's modules is followed, as is the
package a module belongs to (importing ``pkg.model`` runs ``pkg/__init__.py``). The
user's modules are those whose file is neither the interpreter's nor an installed
package's (site-packages) nor the toolkit's. The digest covers those files' bytes.

Read at build time, where the application is imported: no module is imported here; one
an ``import`` statement names but nothing imported yet is found on ``sys.path``.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import site
import sys
import sysconfig
import types
from collections.abc import Iterable

from app_toolkit._runtime import fastapi_compat
from app_toolkit._runtime.replica.ingress_app import ASGI_APP_ATTR, ASGI_BUILDER_ATTR
from app_toolkit.deployment import Deployment

#: How deep an app's mounted apps and routers are searched for endpoints.
_MAX_APP_DEPTH = 16


def sources_digest(func_or_class: object) -> str:
    """The digest of the user's source files ``func_or_class`` depends on ("" if none)."""
    files = user_sources(code_roots(func_or_class))
    if not files:
        return ""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"{name}\0".encode())
        digest.update(_read(files[name]))
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def code_roots(func_or_class: object) -> set[str]:
    """The modules that define ``func_or_class`` and, for an ingress class, its app's
    endpoints, middleware and builder."""
    roots = _modules_of([func_or_class])
    app = getattr(func_or_class, ASGI_APP_ATTR, None)
    if app is not None:
        roots |= _app_modules(app, set(), 0)
    builder = getattr(func_or_class, ASGI_BUILDER_ATTR, None)
    if callable(builder):
        roots |= _modules_of([builder])
    return roots


def user_sources(roots: Iterable[str]) -> dict[str, str]:
    """The user's modules reachable from ``roots`` through import statements (the roots
    included when they are the user's): module name -> file."""
    found: dict[str, str] = {}
    passed: set[str] = set()
    queue = list(roots)
    while queue:
        name = queue.pop()
        if name in found or name in passed:
            continue
        located = _locate(name)
        if located is None or not is_user_source(located[0]):
            passed.add(name)
            continue
        path, is_package = located
        found[name] = path
        parent = name.rpartition(".")[0]
        if parent:
            queue.append(parent)
        if path.endswith(".py"):
            queue.extend(_imports_in_source(_read(path), name, is_package))
    return found


def dependents(modules: Iterable[str], files: Iterable[str]) -> set[str]:
    """The ``modules`` whose user sources include one of ``files`` (the modules to import
    anew after an edit of them)."""
    edited = {os.path.realpath(path) for path in files}
    return {
        name
        for name in modules
        if any(os.path.realpath(path) in edited for path in user_sources([name]).values())
    }


def imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """The modules the import statements of ``module`` (whose source is ``source``) may
    name: ``import a.b`` names ``a.b``; ``from a import b`` names ``a`` and ``a.b`` (``b``
    may be a submodule); relative imports are resolved against ``module``'s package. A
    file that does not parse names none (its import fails where it is built)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            try:
                resolved = importlib.util.resolve_name(base, package) if node.level else base
            except (ImportError, ValueError):
                continue  # beyond the top-level package: its import fails
            names.add(resolved)
            names.update(f"{resolved}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def is_user_source(path: str) -> bool:
    """Whether ``path`` is a file of the user's own code: not the interpreter's standard
    library, not an installed package's, not the toolkit's."""
    real = os.path.realpath(path)
    if "site-packages" in real or "dist-packages" in real:
        return False
    return not real.startswith(_installed_folders())


#: A class made at run time may name its code here (``"module:qualname+what it adds"``):
#: deploys then know it by that name, as they know a module-level class by its own.
CODE_NAME_ATTR = "__app_toolkit_code_name__"


def code_name(func_or_class: object) -> str | None:
    """``module:qualname`` if that names ``func_or_class`` (or the deployment made of it,
    ``@deployment`` above a module-level class), or the name it gives itself in its own
    :data:`CODE_NAME_ATTR`; else None: a class made at run time (``tk.App``'s ingress, one
    defined in a function) is another class each time its module runs, and has no name to
    know it by."""
    given = vars(func_or_class).get(CODE_NAME_ATTR) if isinstance(func_or_class, type) else None
    if isinstance(given, str):
        return given
    module = getattr(func_or_class, "__module__", None)
    qualname = getattr(func_or_class, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<locals>" in qualname:
        return None
    found: object = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if isinstance(found, Deployment):
        found = found.func_or_class
    return f"{module}:{qualname}" if found is func_or_class else None


@functools.cache
def _installed_folders() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    folders = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    folders.update(site.getsitepackages())
    folders.add(os.path.dirname(os.path.abspath(__file__)))  # the toolkit's own package
    return tuple(os.path.join(os.path.realpath(folder), "") for folder in folders)


def _modules_of(objects: Iterable[object]) -> set[str]:
    return {module for obj in objects if isinstance(module := getattr(obj, "__module__", None), str)}


def _app_modules(app: object, seen: set[int], depth: int) -> set[str]:
    """The modules of an ASGI app's (or router's) own class, its routes' endpoints, its
    middleware, and those of the apps and routers mounted in it."""
    if id(app) in seen or depth > _MAX_APP_DEPTH:
        return set()
    seen.add(id(app))
    modules = _modules_of([app if isinstance(app, types.FunctionType) else type(app)])
    modules |= _modules_of(
        getattr(middleware, "cls", None) for middleware in getattr(app, "user_middleware", ())
    )
    routes = getattr(app, "routes", None)
    for route in routes if isinstance(routes, list) else ():
        endpoint = getattr(route, "endpoint", None)
        if endpoint is not None:
            modules |= _modules_of([endpoint])
            continue
        # An included router (FastAPI >= 0.137 keeps it whole), or a mount's app or router.
        inner = fastapi_compat.included_router(route) or getattr(route, "app", None)
        modules |= _app_modules(inner, seen, depth + 1)
    return modules


def _locate(name: str) -> tuple[str, bool] | None:
    """Module ``name``'s file and whether it is a package, without importing it; None if
    it has no file (built in, namespace package) or cannot be found."""
    module = sys.modules.get(name)
    if module is not None:
        try:
            path, is_package = getattr(module, "__file__", None), hasattr(module, "__path__")
        except Exception:  # noqa: BLE001 - what a library put in sys.modules may raise anything
            return None
        return (path, is_package) if isinstance(path, str) else None
    parent, _, _ = name.rpartition(".")
    search: list[str] | None = None
    if parent:
        located = _locate(parent)
        if located is None or not located[1]:
            return None
        search = [os.path.dirname(located[0])]
    try:
        spec = importlib.machinery.PathFinder.find_spec(name, search)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.has_location or spec.origin is None:
        return None
    return spec.origin, spec.submodule_search_locations is not None


@functools.lru_cache(maxsize=1024)
def _imports_in_source(source: bytes, module: str, is_package: bool) -> frozenset[str]:
    """:func:`imported_modules`, parsed once per content (a reload reads every file again)."""
    return frozenset(imported_modules(source.decode(errors="replace"), module, is_package))


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError:
        return b""  # deleted since it was imported: its module still names it
