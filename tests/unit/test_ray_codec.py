"""How the Ray backend serializes user code and data (handle arguments, results, stream
items): the C pickler where it writes what cloudpickle would, cloudpickle elsewhere; apps
of importable modules by reference."""

from __future__ import annotations

import importlib
import pickle
import re
import sys
import threading
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from ray import cloudpickle
from starlette.datastructures import State

import app_toolkit as tk
from app_toolkit._runtime import fastapi_compat
from app_toolkit._runtime.backends.ray.codec import dumps
from app_toolkit._runtime.replica.ingress_app import ASGI_APP_ATTR
from app_toolkit.responses import DeploymentResponse
from tests.apps import basic, shipping
from tests.apps.shipping import WSGIMiddleware  # imported there without its deprecation warning


@dataclass
class Item:
    text: str
    count: int


def test_values_of_importable_types_are_written_by_the_c_pickler() -> None:
    value = {"item": Item("hello", 3), "items": [Item("a", 1)], "blob": b"\x00" * 10}
    blob = dumps(value)
    assert blob == pickle.dumps(value, protocol=5)
    assert pickle.loads(blob) == value


def test_a_class_of_the_drivers_script_travels_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    script = types.new_class("Script")
    script.__module__ = "__main__"
    monkeypatch.setattr(sys.modules["__main__"], "Script", script, raising=False)
    instance = script()
    instance.answer = 42
    blob = dumps(instance)
    monkeypatch.undo()  # another process's __main__ has no such class
    assert not hasattr(sys.modules["__main__"], "Script")
    assert pickle.loads(blob).answer == 42


def test_a_function_of_the_drivers_script_travels_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec("def double(x):\n    return 2 * x\n", namespace)
    monkeypatch.setattr(sys.modules["__main__"], "double", namespace["double"], raising=False)
    blob = dumps(namespace["double"])
    monkeypatch.undo()
    assert pickle.loads(blob)(21) == 42


def test_a_type_variable_of_the_drivers_script_travels_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    Row = typing.TypeVar("Row")
    Row.__module__ = "__main__"
    monkeypatch.setattr(sys.modules["__main__"], "Row", Row, raising=False)
    blob = dumps({"type": Row})
    monkeypatch.undo()
    copied = pickle.loads(blob)["type"]
    assert isinstance(copied, typing.TypeVar) and copied.__name__ == "Row"


def test_a_module_registered_by_value_travels_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("app_toolkit_codec_probe")
    exec("def triple(x):\n    return 3 * x\n", module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]  # cloudpickle is unannotated
    try:
        blob = dumps(module.triple)
    finally:
        cloudpickle.unregister_pickle_by_value(module)  # type: ignore[no-untyped-call]  # as above
    monkeypatch.delitem(sys.modules, module.__name__)  # not importable where it is loaded
    assert pickle.loads(blob)(5) == 15


def test_what_the_c_pickler_cannot_write_goes_to_cloudpickle() -> None:
    offset = 7
    assert pickle.loads(dumps(lambda x: x + offset))(1) == 8
    copied = pickle.loads(dumps({"lock": threading.Lock(), "rlock": threading.RLock()}))
    assert copied["lock"].acquire(blocking=False)  # a fresh lock


def test_starlette_state_keeps_its_reducer() -> None:
    copied = pickle.loads(dumps({"state": State({"model": "m", "rows": 3})}))
    assert copied["state"].model == "m" and copied["state"].rows == 3


def test_fastapis_unset_marker_stays_the_one_fastapi_compares_with() -> None:
    import fastapi.datastructures  # noqa: F401 - loads the marker, as an app does

    unset = fastapi_compat.unset_marker()
    if unset is None:  # FastAPI < 0.136: pydantic's PydanticUndefined, a singleton
        from pydantic_core import PydanticUndefined as unset
    assert pickle.loads(dumps({"unset": unset}))["unset"] is unset  # FastAPI uses ``is``


def test_dataclass_field_markers_stay_the_ones_dataclasses_compares_with() -> None:
    import dataclasses

    marker = dataclasses._FIELD  # type: ignore[attr-defined]
    assert pickle.loads(dumps([marker]))[0] is marker


def test_a_value_nothing_can_write_is_a_clear_type_error() -> None:
    with pytest.raises(TypeError, match="Cannot serialize generator"):
        dumps(x for x in range(3))


# ------------------------------------------- apps go to replicas as the user wrote them


def test_an_app_or_router_of_an_importable_module_travels_by_reference() -> None:
    for written in (shipping.wsgi_app, basic.router):
        assert pickle.loads(dumps({"app": written}))["app"] is written  # imported, not copied


def test_an_app_outside_importable_modules_travels_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    app = FastAPI()
    assert isinstance(pickle.loads(dumps(app)), FastAPI)
    monkeypatch.setattr(sys.modules["__main__"], "app", app, raising=False)
    assert pickle.loads(dumps(app)) is not app  # the driver's script is not imported by replicas


def test_an_included_router_of_an_importable_module_is_included_again_from_it() -> None:
    app = FastAPI()
    app.include_router(shipping.wsgi_router)
    app.openapi()  # FastAPI makes the included routes now, with a copy of the mount pickle cannot write
    copied = pickle.loads(dumps(app))
    assert list(copied.openapi()["paths"]) == ["/asgi"]
    if fastapi_compat.included_router_type() is not None:  # FastAPI >= 0.137 keeps it whole
        assert [fastapi_compat.included_router(route) for route in copied.router.routes[-1:]] == [
            shipping.wsgi_router
        ]


def test_a_copied_function_of_an_importable_module_reads_its_modules_globals() -> None:
    route = shipping.LocalEndpointsRouter().routes[0]
    assert isinstance(route, APIRoute)
    copied = pickle.loads(dumps(route.endpoint))
    assert copied is not route.endpoint and copied.__globals__ is vars(shipping)
    assert typing.get_type_hints(copied)["request"] is Request  # a name only annotations use


def test_a_copied_function_leaves_its_modules_globals_as_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "codec_probe.py").write_text(
        "LIMIT = 1\n\ndef make():\n    def limit():\n        return LIMIT, LATER\n\n    return limit\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("codec_probe")
    try:
        setattr(module, "LATER", "set at run time")  # noqa: B010 - a global the import does not define
        blob = dumps(module.make())
        setattr(module, "LIMIT", 2)  # noqa: B010 - what this process's import made differs from the driver's
        delattr(module, "LATER")  # as in a replica whose import made only LIMIT
        copied = pickle.loads(blob)
        # The import's LIMIT stays (cloudpickle alone writes LIMIT = 1 into it); LATER,
        # which the import did not make, comes from the driver.
        assert copied() == (2, "set at run time") and module.LIMIT == 2
        blob = dumps(module.make())
        monkeypatch.undo()
        del sys.modules["codec_probe"]  # a worker that cannot import it
        copied = pickle.loads(blob)
        assert copied() == (2, "set at run time") and copied.__globals__ is not vars(module)
    finally:
        sys.modules.pop("codec_probe", None)


_SCRIPT = """
from __future__ import annotations

from fastapi import APIRouter, Request


class LocalEndpointsRouter(APIRouter):
    def __init__(self) -> None:
        super().__init__()

        async def handle(request: Request) -> str:
            return "handled"

        self.add_api_route("/graphql", handle, methods=["POST"])
"""


def test_an_ingress_copy_keeps_what_fastapi_resolved_where_the_module_does_not_travel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = types.ModuleType("app_toolkit_codec_script")  # not importable by replicas
    exec(_SCRIPT, script.__dict__)
    monkeypatch.setitem(sys.modules, script.__name__, script)
    app = FastAPI()
    app.include_router(script.LocalEndpointsRouter())

    @tk.ingress(app)
    class Ingress:
        pass

    cloudpickle.register_pickle_by_value(script)  # type: ignore[no-untyped-call]  # cloudpickle is unannotated
    try:
        blob = dumps(Ingress)
    finally:
        cloudpickle.unregister_pickle_by_value(script)  # type: ignore[no-untyped-call]  # as above
    monkeypatch.undo()
    copied = getattr(pickle.loads(blob), ASGI_APP_ATTR)
    assert "parameters" not in copied.openapi()["paths"]["/graphql"]["post"]  # request is no query


def test_an_app_that_cannot_be_copied_is_named_with_the_fix() -> None:
    app = FastAPI()
    app.mount("/wsgi", WSGIMiddleware(shipping.WeakWSGIApp()))

    @tk.ingress(app)
    class Ingress:
        pass

    with pytest.raises(TypeError) as failed:
        dumps(Ingress)
    message = str(failed.value)
    assert "Cannot serialize Ingress: cannot pickle 'weakref.ReferenceType' object" in message
    assert re.search(r"\(the ReferenceType at Ingress\.__app_toolkit_asgi_app__\.\S+\.owner_ref\)", message)
    assert "inside Ingress.__app_toolkit_asgi_app__ (a FastAPI)" in message
    assert "at module level of an importable module, so replicas import it" in message
    assert "builder function" in message


def test_a_response_nested_in_a_value_is_refused_as_ray_serve_refuses_it() -> None:
    response = DeploymentResponse.__new__(DeploymentResponse)  # no call behind it: never sent
    with pytest.raises(tk.RayServeException, match="`DeploymentResponse` is not serializable"):
        dumps(("args", [response]))


def test_an_autoscaling_policy_travels_with_its_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """By value, as Ray Serve sends a policy: the controller loads it without importing
    the application's module (here: the module cannot be imported where it is loaded)."""
    from app_toolkit._runtime.messages import ByValue
    from tests.apps import policies

    data = dumps(ByValue(policies.hold))
    monkeypatch.setitem(sys.modules, "tests.apps.policies", None)  # an import would fail
    loaded = pickle.loads(data)
    assert loaded is not policies.hold and loaded.__name__ == "hold"
    registered = cloudpickle.list_registry_pickle_by_value()  # type: ignore[no-untyped-call]
    assert registered == set()  # registered for that dump only
