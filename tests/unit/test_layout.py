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


def _imports_in(name: str, source: str, package: bool = False) -> set[str]:
    """Every module the source of module ``name`` (a package's ``__init__`` when
    ``package``) imports, at the top or inside functions: relative imports resolved to
    absolute names, so ``from .._runtime import x`` counts as ``app_toolkit._runtime.x``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                module = node.module or ""
            else:  # the package the dots name: its own for one dot, its parent's for two...
                parts = name.split(".") if package else name.split(".")[:-1]
                base = parts[: len(parts) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            found.add(module)
            found.update(
                f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in MODULES
            )
    return found


def _imports(name: str) -> set[str]:
    """Every module the package's module ``name`` imports."""
    path = MODULES[name]
    return _imports_in(name, path.read_text(), package=path.name == "__init__.py")


def test_relative_imports_are_read_as_the_modules_they_name() -> None:
    assert _imports_in("app_toolkit.llm.engines.decoder", "from ..engine import Sampling") == {
        "app_toolkit.llm.engine"
    }
    assert _imports_in("app_toolkit.llm.engines", "from . import echo", package=True) >= {
        "app_toolkit.llm.engines.echo"
    }
    assert _imports_in("app_toolkit.autoscaling_policy", "def f():\n    from ._runtime import messages") >= {
        "app_toolkit._runtime.messages"
    }
    # The package's own relative imports are among what the rules below read.
    assert {"app_toolkit.llm.engine", "app_toolkit.llm.engines.prefix_cache"} <= _imports(
        "app_toolkit.llm.engines.decoder"
    )


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


#: Outside the Ray backend, the one module that reads Ray: the vLLM engine hands the
#: replica's placement group to vLLM's Ray executor (its engine core is a process of its own,
#: which cannot find the group), as Ray Serve LLM does; only for a model on accelerators.
RAY_READERS = {"app_toolkit.llm.engines.vllm_start"}


def test_only_the_ray_backend_imports_ray() -> None:
    importers = {
        name for name in MODULES if any(dep == "ray" or dep.startswith("ray.") for dep in _imports(name))
    }
    outside = importers - RAY_READERS
    assert outside and all(name.startswith(RAY_BACKEND) for name in outside), importers


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


#: The layers, lowest first: the shared vocabulary (these modules and packages, with all
#: below them: options, exceptions, status, metrics, import strings, deployment ids, the
#: request routers callers route with), which imports nothing else of the package; the
#: runtime (``_runtime/``), which imports only the vocabulary; the rest of the public layer
#: (handles, deployments, building, the CLI, ``llm/``) above both.
VOCABULARY = {
    "app_toolkit.autoscaling_policy",
    "app_toolkit.config",
    "app_toolkit.deployment_id",
    "app_toolkit.replica_id",
    "app_toolkit.exceptions",
    "app_toolkit.status",
    "app_toolkit.metrics",
    "app_toolkit.import_path",
    "app_toolkit.request_router",
}


def _in_vocabulary(module: str) -> bool:
    return any(module == entry or module.startswith(entry + ".") for entry in VOCABULARY)


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
        if not dep.startswith(RUNTIME) and dep != "app_toolkit" and not _in_vocabulary(dep)
    }
    assert upward == set()


def _above_the_vocabulary(imports: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The (module, import) pairs by which vocabulary modules reach a layer above theirs:
    any of the package's modules outside the vocabulary, the runtime's included (``from
    app_toolkit import x`` counts when ``x`` is a module)."""
    return {
        (name, dep)
        for name, deps in imports.items()
        if _in_vocabulary(name)
        for dep in deps
        if dep.startswith("app_toolkit.") and not _in_vocabulary(dep)
    }


def test_the_vocabulary_imports_nothing_above_it() -> None:
    assert _above_the_vocabulary({name: _imports(name) for name in MODULES}) == set()


def test_the_vocabulary_rule_catches_an_import_back_up() -> None:
    """The three imports that once ran back up, written absolute and relative."""
    imports = {
        "app_toolkit.config.http": _imports_in(
            "app_toolkit.config.http",
            "def check():\n    from .._runtime.front.metrics_page import parse_networks",
        ),
        "app_toolkit.request_router.prefix_aware": _imports_in(
            "app_toolkit.request_router.prefix_aware",
            "from app_toolkit._runtime.shared_prefix import shared_prefix",
        ),
        "app_toolkit.autoscaling_policy": _imports_in(
            "app_toolkit.autoscaling_policy", "from ._runtime.messages import DeploymentID"
        ),
    }
    assert _above_the_vocabulary(imports) == {
        ("app_toolkit.config.http", "app_toolkit._runtime.front.metrics_page"),
        ("app_toolkit.request_router.prefix_aware", "app_toolkit._runtime.shared_prefix"),
        ("app_toolkit.autoscaling_policy", "app_toolkit._runtime.messages"),
    }


def test_llm_uses_the_toolkit_as_an_application_does() -> None:
    """``llm/`` reaches the toolkit through public names, never the runtime's internals."""
    reaching_in = {
        (name, dep)
        for name in MODULES
        if name.startswith("app_toolkit.llm.") or name == "app_toolkit.llm"
        for dep in _imports(name)
        if dep == RUNTIME or dep.startswith(RUNTIME + ".")
    }
    assert reaching_in == set()


#: The parts of ``llm/`` and the parts each must not import: the ingress (``openai/``) loads
#: no model, so it names neither the model's replica nor the engines; the engines know
#: nothing of the server that drives them; the replica answers its callers through handles.
LLM = "app_toolkit.llm"
LLM_FORBIDDEN = {
    "openai": {"replica", "engines"},
    "engines": {"replica", "openai"},
    "replica": {"openai"},
}


def _llm_part(module: str) -> str:
    return module[len(LLM) + 1 :].split(".")[0] if module.startswith(LLM + ".") else ""


def _llm_crossings(imports: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (name, dep)
        for name, deps in imports.items()
        for dep in deps
        if _llm_part(dep) in LLM_FORBIDDEN.get(_llm_part(name), set())
    }


def test_the_parts_of_llm_import_only_what_they_may() -> None:
    assert _llm_crossings({name: _imported_modules(name) for name in MODULES}) == set()


def test_the_llm_rule_catches_a_crossing() -> None:
    imports = {
        "app_toolkit.llm.openai.chat": _imports_in(
            "app_toolkit.llm.openai.chat", "from ..replica.shaping import structure_for"
        ),
        "app_toolkit.llm.engines.echo": _imports_in(
            "app_toolkit.llm.engines.echo", "def f():\n    from app_toolkit.llm.replica import server"
        ),
    }
    assert _llm_crossings(imports) == {
        ("app_toolkit.llm.openai.chat", "app_toolkit.llm.replica.shaping"),
        ("app_toolkit.llm.engines.echo", "app_toolkit.llm.replica"),
        ("app_toolkit.llm.engines.echo", "app_toolkit.llm.replica.server"),
    }


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
