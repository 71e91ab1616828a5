"""The package's shape, checked from its source: no import circles, Ray behind the backend
seam, concrete links named only by the backends and their table."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "app_toolkit"
RAY_BACKEND = "app_toolkit._runtime.backends.ray"
BACKENDS = "app_toolkit._runtime.backends"
LINKS = ("RayLink", "LocalLink")


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """Every module ``name`` imports, at the top or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(
                f"{node.module}.{alias.name}"
                for alias in node.names
                if f"{node.module}.{alias.name}" in MODULES
            )
    return found


def test_the_package_has_no_import_circles() -> None:
    graph = {name: {dep for dep in _imports(name) if dep in MODULES and dep != name} for name in MODULES}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                circles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    # A package's __init__ importing its own modules is how re-exports work, not a circle.
    circles = [c for c in circles if not any(c[i + 1].startswith(c[i] + ".") for i in range(len(c) - 1))]
    assert circles == []


def test_only_the_ray_backend_imports_ray() -> None:
    importers = {
        name for name in MODULES if any(dep == "ray" or dep.startswith("ray.") for dep in _imports(name))
    }
    assert importers and all(name.startswith(RAY_BACKEND) for name in importers), importers


def test_only_the_backends_name_a_concrete_link() -> None:
    naming = {
        name
        for name, path in MODULES.items()
        if "RayLink" in path.read_text() or "LocalLink" in path.read_text()
    }
    assert naming and all(name.startswith(BACKENDS + ".") for name in naming), naming
    # The backend table names the backend modules by string; nobody else imports them.
    importers = {
        name
        for name in MODULES
        for dep in _imports(name)
        if dep.startswith(BACKENDS + ".") and dep != BACKENDS + ".base" and not name.startswith(BACKENDS)
    }
    assert importers == set()


def _package_folders(root: Path, name: str) -> set[str]:
    """``name`` for ``root``, and a dotted name for every folder below it that holds files
    and whose path could be imported: what setuptools takes for a package (one left out of
    the list draws its warning, "absent from the packages configuration")."""
    found = {name}
    for folder in root.rglob("*"):
        parts = folder.relative_to(root).parts
        if (
            folder.is_dir()
            and all(part.isidentifier() for part in parts)
            and "__pycache__" not in parts
            and any(path.is_file() for path in folder.iterdir())
        ):
            found.add(".".join((name, *parts)))
    return found


def test_pyproject_lists_every_package() -> None:
    """Packages are listed by hand (the templates install from outside app_toolkit/), data
    folders (the dashboard's files, each template) included."""
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = _package_folders(PACKAGE, "app_toolkit") | _package_folders(
        PACKAGE.parent / "templates", "app_toolkit.templates"
    )
    assert {"app_toolkit._runtime.front.dashboard_files", "app_toolkit.templates.chat.hooks"} <= on_disk
    assert on_disk == set(config["packages"])
    assert config["package-dir"] == {"app_toolkit.templates": "templates"}


#: What code under _runtime/ may import from the public layer: the shared vocabulary
#: (options, exceptions, status, metrics, import strings, the request router interface
#: callers route with). Anything else
#: there (handles, deployments, building, the CLI) sits above the runtime.
PUBLIC_ENTRY_POINTS = {
    "app_toolkit.autoscaling_policy",
    "app_toolkit.config",
    "app_toolkit.exceptions",
    "app_toolkit.status",
    "app_toolkit.metrics",
    "app_toolkit.import_path",
    "app_toolkit.request_router",
    "app_toolkit.request_router.loading",
}

#: The parts of the runtime and the parts each must not import: the backends put the
#: parts together; no part reaches back up into them or sideways into a peer it serves.
RUNTIME = "app_toolkit._runtime"
FORBIDDEN = {
    "channel": {"backends", "controller", "front", "proxy", "replica", "routing", "session"},
    "controller": {"backends", "channel", "front", "proxy", "replica", "routing", "session"},
    "routing": {"backends", "controller", "direct_ingress", "front", "proxy", "replica", "session"},
    "replica": {"backends", "controller", "direct_ingress", "front", "proxy", "routing", "session"},
    # The HTTP front runs in the proxy and in ingress replicas: it names neither's own code.
    "front": {"backends", "controller", "direct_ingress", "proxy", "replica", "session", "drain_signal"},
    # The replica's side of direct ingress: the front and the replica, put together by a backend.
    "direct_ingress": {"backends", "controller", "proxy", "session"},
    "proxy": {"backends", "controller", "replica", "session"},  # the node's proxy's own
    "session": {"backends"},
}


def _imported_modules(name: str) -> set[str]:
    """The package's modules ``name`` imports (``from app_toolkit import x`` names x)."""
    return {dep for dep in _imports(name) if dep in MODULES}


def test_the_runtime_imports_only_the_public_vocabulary() -> None:
    upward = {
        (name, dep)
        for name in MODULES
        if name.startswith(RUNTIME)
        for dep in _imported_modules(name)
        if not dep.startswith(RUNTIME) and dep != "app_toolkit" and dep not in PUBLIC_ENTRY_POINTS
    }
    assert upward == set()


def test_no_part_of_the_runtime_imports_upward_or_sideways() -> None:
    def part(module: str) -> str:
        return module[len(RUNTIME) + 1 :].split(".")[0] if module.startswith(RUNTIME + ".") else ""

    crossings = {
        (name, dep)
        for name in MODULES
        for dep in _imported_modules(name)
        if part(dep) in FORBIDDEN.get(part(name), set())
    }
    assert crossings == set()


def test_the_architecture_page_names_every_runtime_module() -> None:
    """docs/architecture.md's table of modules, and the process each runs in, is whole."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    section = page[page.index("## Where the code lives") :]
    section = section[: section.index("\n## ", 1)]
    runtime = PACKAGE / "_runtime"
    modules = sorted(
        str(path.relative_to(runtime)) for path in runtime.rglob("*.py") if path.name != "__init__.py"
    )
    assert len(modules) > 50  # the runtime is where it was
    missing = [module for module in modules if f"`{module}`" not in section]
    assert missing == [], f"add them to docs/architecture.md's module table: {missing}"
