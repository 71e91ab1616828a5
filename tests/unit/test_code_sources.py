"""What a deployment's code depends on (app_toolkit/code_sources.py), and how its code
version follows it: a reload replaces a deployment only when one of its files changed."""

from __future__ import annotations

import hashlib
import importlib
import json
import pickle
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fastapi
import pytest

import app_toolkit as tk
from app_toolkit import code_sources
from app_toolkit.build import build_app, build_spec
from app_toolkit.code_sources import (
    code_name,
    code_roots,
    dependents,
    imported_modules,
    is_user_source,
    sources_digest,
    user_sources,
)
from app_toolkit.config.file import parse_config

#: A tiny project: an ingress that binds a model; the model imports a helper of its own.
PROJECT = {
    "shop_ingress.py": (
        "from fastapi import APIRouter\n"
        "import app_toolkit as tk\n"
        "from shop_model import Model\n"
        "import shop_pages\n"
        "router = APIRouter()\n"
        "@router.get('/')\n"
        "def root(model: tk.DeploymentHandle = tk.Depends(Model)) -> int:\n"
        "    return 1\n"
        "app = tk.App(router)\n"
    ),
    "shop_pages.py": "TITLE = 'shop'\n",
    "shop_model.py": (
        "import json\n"
        "import app_toolkit as tk\n"
        "from shop_weights import load\n"
        "@tk.deployment\n"
        "class Model:\n"
        "    def __init__(self) -> None:\n"
        "        from shop_lazy import WARM  # imported in the replica only\n"
        "        self.weights = load()\n"
    ),
    "shop_weights.py": "def load() -> list[int]:\n    return [1, 2]\n",
    "shop_lazy.py": "WARM = True\n",
    "shop_unused.py": "import shop_model\n",
}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The project's folder, first on sys.path; its modules are forgotten afterwards."""
    for name, source in PROJECT.items():
        (tmp_path / name).write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    _forget()


def _forget() -> None:
    for name in [name for name in sys.modules if name.startswith("shop_")]:
        del sys.modules[name]


def _reimport(module: str) -> Any:
    """``module`` imported anew with every project module (as a config file's build on Ray
    does, in a fresh process: the most a reload imports again)."""
    _forget()
    return importlib.import_module(module)


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        ("import a.b, c", "m", False, {"a.b", "c"}),
        ("from a import b, c", "m", False, {"a", "a.b", "a.c"}),
        ("from . import b", "pkg.m", False, {"pkg", "pkg.b"}),
        ("from .b import c", "pkg", True, {"pkg.b", "pkg.b.c"}),
        ("from ..b import *", "pkg.sub.m", False, {"pkg.b"}),
        ("def f():\n    import lazy", "m", False, {"lazy"}),
        ("from .. import b", "m", False, set()),  # beyond the top level: its import fails
        ("import (", "m", False, set()),  # does not parse: its import fails where it is built
    ],
)
def test_imported_modules_resolves_each_import_statement(
    source: str, module: str, is_package: bool, expected: set[str]
) -> None:
    assert imported_modules(source, module, is_package) == expected


def test_user_sources_follow_imports_through_the_users_modules_only(project: Path) -> None:
    # Nothing is imported: the files are found on sys.path.
    model = user_sources({"shop_model"})
    expected = ("shop_model", "shop_weights", "shop_lazy")
    assert model == {name: str(project / f"{name}.py") for name in expected}
    ingress = user_sources({"shop_ingress"})
    assert set(ingress) == {*model, "shop_ingress", "shop_pages"}  # not json, fastapi, app_toolkit
    assert "shop_model" not in sys.modules


def test_dependents_are_the_modules_to_import_anew_after_an_edit(project: Path) -> None:
    modules = ["shop_ingress", "shop_model", "shop_pages", "shop_unused", "shop_weights"]
    assert dependents(modules, [str(project / "shop_weights.py")]) == {
        "shop_weights",
        "shop_model",
        "shop_ingress",
        "shop_unused",
    }
    assert dependents(modules, [str(project / "shop_pages.py")]) == {"shop_pages", "shop_ingress"}
    assert dependents(modules, [str(project / "elsewhere.py")]) == set()


def test_a_package_module_depends_on_its_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "shop_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .models import Model\n")
    (package / "models.py").write_text("from . import helpers\nclass Model: ...\n")
    (package / "helpers.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert set(user_sources({"shop_pkg.models"})) == {"shop_pkg", "shop_pkg.models", "shop_pkg.helpers"}


def test_is_user_source_leaves_out_the_interpreters_installed_and_the_toolkits_files(tmp_path: Path) -> None:
    assert is_user_source(str(tmp_path / "mine.py"))
    assert not is_user_source(json.__file__)
    assert not is_user_source(fastapi.__file__)
    assert not is_user_source(code_sources.__file__)


def test_an_edit_changes_the_digest_of_the_deployments_that_depend_on_the_file(project: Path) -> None:
    model = _reimport("shop_model").Model.func_or_class
    before = sources_digest(model)
    assert len(before) == 16
    (project / "shop_ingress.py").write_text(PROJECT["shop_ingress.py"] + "# edited\n")
    (project / "shop_unused.py").write_text("# edited\n")
    assert sources_digest(_reimport("shop_model").Model.func_or_class) == before
    (project / "shop_weights.py").write_text("def load() -> list[int]:\n    return [3]\n")
    assert sources_digest(_reimport("shop_model").Model.func_or_class) != before


def test_the_roots_of_an_ingress_are_its_routes_modules(project: Path) -> None:
    ingress = _reimport("shop_ingress").app.deployment.func_or_class
    assert "shop_ingress" in code_roots(ingress)
    assert "shop_ingress" in user_sources(code_roots(ingress))


def test_code_name_is_where_a_replica_finds_the_code(project: Path) -> None:
    model = _reimport("shop_model").Model.func_or_class
    assert code_name(model) == "shop_model:Model"

    class Local: ...

    assert code_name(Local) is None
    assert code_name(_reimport("shop_ingress").app.deployment.func_or_class) is None  # tk.App made it


_KEPT: list[object] = []  # what the serializer keyed by id(), alive as the backend keeps it


def _local_serializer() -> Callable[[object], bytes]:
    """The local backend's keys: code by object (a re-import is another), data by value.
    Like the backend, it keeps what it keyed by ``id()``: a freed object's id may be the
    next one's, and a re-import would then look like the same code."""

    def serialize(value: object) -> bytes:
        if callable(value):
            _KEPT.append(value)
            return hashlib.sha256(b"object %d" % id(value)).digest()
        return hashlib.sha256(pickle.dumps(value)).digest()

    return serialize


def _versions(mode: str) -> dict[str, str]:
    """Each deployment's code version, built as ``app-toolkit run`` builds it after a
    reload: from an import path (in this process), or from a config file's entry."""
    if mode == "import-path":
        app = _reimport("shop_ingress").app
        assert isinstance(app, tk.App)
        spec = build_app(app, "shop", "/", _local_serializer())
    else:
        _forget()
        config = parse_config({"applications": [{"name": "shop", "import_path": "shop_ingress:app"}]}, "f")
        spec = build_spec(config.applications[0], _local_serializer())
    return {deployment.id.name: deployment.code_version for deployment in spec.deployments}


@pytest.mark.parametrize("mode", ["import-path", "config-file"])
def test_a_reimport_keeps_the_model_s_version_until_its_own_files_change(project: Path, mode: str) -> None:
    first = _versions(mode)
    (project / "shop_unused.py").write_text("# edited\n")
    unrelated = _versions(mode)
    assert unrelated["Model"] == first["Model"]
    # tk.App's ingress is made anew by each import of its module: an import path's is
    # another version, a config file's entry knows it by its import path and files.
    assert (unrelated["Ingress"] == first["Ingress"]) is (mode == "config-file")
    (project / "shop_ingress.py").write_text(PROJECT["shop_ingress.py"].replace("return 1", "return 2"))
    second = _versions(mode)
    assert second["Model"] == first["Model"]
    assert second["Ingress"] != first["Ingress"]
    (project / "shop_model.py").write_text(PROJECT["shop_model.py"] + "# edited\n")
    third = _versions(mode)
    assert third["Model"] != second["Model"]
    assert third["Ingress"] != second["Ingress"]  # its routes' module imports the model's
