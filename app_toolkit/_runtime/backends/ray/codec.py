"""How the Ray backend writes user code and data (deployment definitions, handle
arguments, results, stream items): the C pickler where it writes what cloudpickle would,
cloudpickle elsewhere.

Apps go to replicas as the user wrote them (docs/deploy.md, "How an app reaches its
replicas"):

- an app or router (a Starlette or FastAPI app, a Starlette router or FastAPI
  ``APIRouter``) that is an attribute of an importable module (not the driver's script)
  is written as that module and name: the replica imports it;
- a function cloudpickle must copy (one defined inside another, ``<locals>``) of an
  importable module gets that module's globals in the replica, not just the names its
  code reads: FastAPI resolves the annotations of an endpoint against them (with
  ``from __future__ import annotations`` they are strings naming module globals).
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import logging
import pickle
import sys
import threading
import types
import typing
from typing import Any

from ray import cloudpickle
from starlette.datastructures import State

from app_toolkit._runtime import fastapi_compat
from app_toolkit._runtime.backends.ray import ray_compat
from app_toolkit._runtime.messages import ByValue
from app_toolkit.exceptions import AppToolkitError

logger = logging.getLogger("app_toolkit")

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


_APP_TYPES: list[tuple[type, ...]] = []  # both classes, once both are loaded


def _app_types() -> tuple[type, ...]:
    """The classes of apps and routers loaded in this process (none: no app can exist);
    looked up until both are loaded, then kept (``dumps`` asks on every call)."""
    if _APP_TYPES:
        return _APP_TYPES[0]
    found = (
        getattr(sys.modules.get("starlette.applications"), "Starlette", None),
        getattr(sys.modules.get("starlette.routing"), "Router", None),
    )
    kinds = tuple(kind for kind in found if isinstance(kind, type))
    if len(kinds) == len(found):
        _APP_TYPES.append(kinds)
    return kinds


def _importable(module: object, by_value: frozenset[str]) -> bool:
    """Whether ``module`` is one a replica imports by name: not the driver's script, not
    made at run time (no spec), not registered with cloudpickle to travel by value."""
    if not isinstance(module, types.ModuleType) or getattr(module, "__spec__", None) is None:
        return False
    name = module.__name__
    if name in ("__main__", "__mp_main__") or sys.modules.get(name) is not module:
        return False
    return not any(name == entry or name.startswith(entry + ".") for entry in by_value)


def _registered_by_value() -> frozenset[str]:
    return frozenset(cloudpickle.list_registry_pickle_by_value())  # type: ignore[no-untyped-call]


def _module_attributes(kinds: tuple[type, ...]) -> dict[int, tuple[str, str]]:
    """Where each app or router that is an attribute of an importable module lives:
    ``id(app) -> (module, name)``. An app found in several modules (``from main import
    app`` elsewhere) is named by the one imported last, which is usually where it is
    defined: a module that re-exports an app imports its module first."""
    places: dict[int, tuple[str, str]] = {}
    by_value = _registered_by_value()
    for module in list(sys.modules.values()):
        if not _importable(module, by_value):
            continue
        for name, value in list(vars(module).items()):
            if issubclass(type(value), kinds):  # type(): an attribute's __class__ may be anything
                places[id(value)] = (module.__name__, name)
    return places


def _import_attribute(module: str, name: str) -> object:
    """``module.name``, imported in the replica (an app written by reference)."""
    return getattr(importlib.import_module(module), name)


class _ModuleGlobals:
    """The globals of the copied functions of one importable module: the module's own,
    imported in the replica; if it cannot be imported there, the names the functions'
    code reads (what cloudpickle alone would give them)."""

    def __init__(self, module: str, fallback: dict[str, Any]) -> None:
        self.module = module
        self.fallback = fallback

    def __reduce__(self) -> tuple[Any, ...]:
        return (_module_globals, (self.module, self.fallback))


def _module_globals(module: str, fallback: dict[str, Any]) -> dict[str, Any]:
    try:
        return vars(importlib.import_module(module))
    except Exception:  # not importable here (path, or its import fails): it keeps what it read
        logger.warning(
            "Module %s could not be imported here; a copied function of it keeps "
            "only the globals its code reads",
            module,
            exc_info=True,
        )
        return fallback


def _set_function_state(function: types.FunctionType, state: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """cloudpickle's, except that a function living in its imported module's globals
    leaves the values the import made as they are (cloudpickle would write the driver's
    over them) and gets the driver's only for names the import did not define (set at
    run time)."""
    own, slots = state
    module = sys.modules.get(function.__globals__.get("__name__", ""))
    if module is not None and vars(module) is function.__globals__:
        for name, value in slots.get("__globals__", {}).items():
            function.__globals__.setdefault(name, value)
        slots = {**slots, "__globals__": {}}
    ray_compat.function_setstate(function, (own, slots))


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, plus fresh locks and Starlette ``State`` (FastAPI apps hold both), and
    FastAPI's "not given" marker kept as the one it is compared with (``is``): a copy of
    it would read as a given ``example`` and put ``"example": {}`` into the OpenAPI. Apps
    and routers of importable modules are written by reference, and copied functions of
    importable modules keep their module's globals (the module docstring says why)."""

    def __init__(self, file: io.BytesIO, places: dict[int, tuple[str, str]] | None = None) -> None:
        super().__init__(file, protocol=5)  # type: ignore[no-untyped-call]
        unset = fastapi_compat.unset_marker()  # no FastAPI app without it
        self._unset = self if unset is None else unset
        self._apps = _app_types()
        # FastAPI >= 0.137 keeps an included router as this entry, with the routes it made
        # from the router's (and their analysed endpoints) as a cache.
        self._included = fastapi_compat.included_router_type()
        self._places = places  # found when first needed
        self._globals: dict[str, _ModuleGlobals] = {}

    def place_of(self, obj: object) -> tuple[str, str] | None:
        """The module and name of ``obj``, an app or router, if it is written by reference."""
        if self._places is None:
            self._places = _module_attributes(self._apps)
        place = self._places.get(id(obj))
        if place is None or getattr(sys.modules.get(place[0]), place[1], None) is not obj:
            return None
        return place

    def reducer_override(self, obj: object) -> Any:
        # A type reduced here must also stop the C pickler's attempt (_Plain, _REDUCED).
        if obj is self._unset:
            return (fastapi_compat.load_unset_marker, ())
        if type(obj) is _LOCK_TYPES[0]:
            return (threading.Lock, ())
        if type(obj) is _LOCK_TYPES[1]:
            return (threading.RLock, ())
        if type(obj) is State:
            return (State, (dict(obj._state),))
        if self._apps and issubclass(type(obj), self._apps):
            place = self.place_of(obj)
            if place is not None:
                return (_import_attribute, place)
        elif type(obj) is self._included:
            router = fastapi_compat.included_router(obj)
            if self.place_of(router) is not None:
                # The replica makes the routes again from the router it imports, not from
                # the driver's copies of them (which may hold what cannot be written, as a
                # mount may).
                return (type(obj), (router, getattr(obj, "include_context", None)))
        return super().reducer_override(obj)  # type: ignore[no-untyped-call]

    def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
        reduced = super()._dynamic_function_reduce(func)  # type: ignore[no-untyped-call]  # as above
        module = sys.modules.get(func.__module__ or "")
        if module is None or vars(module) is not func.__globals__:
            return reduced
        if not _importable(module, _registered_by_value()):
            return reduced
        make, (code, fallback, *rest), state, *_ = reduced
        shared = self._globals.setdefault(module.__name__, _ModuleGlobals(module.__name__, fallback))
        return (make, (code, shared, *rest), state, None, None, _set_function_state)


class _WrittenOtherwise(Exception):
    """Raised by :class:`_Plain` for what cloudpickle must write."""


class _Plain(pickle.Pickler):
    """The C pickler, stopping at what cloudpickle (with :class:`_Pickler`'s reducers)
    writes differently from it: a class or function of the driver's script (cloudpickle
    writes it by value; a ``TypeVar`` of it too, which the C pickler would write by
    name), Starlette's ``State``, FastAPI's ``DefaultPlaceholder``, the markers of
    dataclass fields (cloudpickle keeps them the objects ``dataclasses`` compares with),
    apps and routers (which may go by reference). What the C pickler cannot write at all
    (a lambda, a lock, a module, a file) it refuses by itself. Builtin values (str,
    bytes, numbers, containers) never reach ``reducer_override``, so a large array or
    list costs nothing extra."""

    def reducer_override(self, obj: object) -> Any:
        if isinstance(obj, (type, types.FunctionType)):
            if getattr(obj, "__module__", None) in (None, "__main__"):
                raise _WrittenOtherwise
        elif type(obj) in _REDUCED or _is_placeholder(obj) or issubclass(type(obj), _app_types()):
            raise _WrittenOtherwise
        return NotImplemented


_REDUCED = frozenset({*_LOCK_TYPES, State, dataclasses._FIELD_BASE, typing.TypeVar})  # type: ignore[attr-defined]


def _is_placeholder(obj: object) -> bool:
    kind = type(obj)
    return kind.__name__ == "DefaultPlaceholder" and kind.__module__ == "fastapi.datastructures"


def dumps(value: object) -> bytes:
    """Serialize user code and data (by value where it is not importable).

    Values of importable types (handle arguments, results, stream items: the usual case)
    are written by the C pickler (:class:`_Plain`), which writes what cloudpickle would
    about twice as fast; anything it cannot write or writes differently, and every value
    while a module is registered to be pickled by value, goes to cloudpickle.
    """
    if isinstance(value, ByValue):
        return _dumps_by_value(value)
    if not cloudpickle.list_registry_pickle_by_value():  # type: ignore[no-untyped-call]
        buffer = io.BytesIO()
        try:
            _Plain(buffer, protocol=5).dump(value)
        except Exception:  # noqa: BLE001 - cloudpickle, below, writes it or says what is wrong
            pass
        else:
            return buffer.getvalue()
    buffer = io.BytesIO()
    try:
        _Pickler(buffer).dump(value)  # type: ignore[no-untyped-call]
    except AppToolkitError:  # refused on purpose (a nested DeploymentResponse): as it is
        raise
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to fix
        raise TypeError(_cannot_write(value, exc)) from None
    return buffer.getvalue()


def _dumps_by_value(value: ByValue) -> bytes:
    """``value`` with the code of its module (not the toolkit's), as Ray Serve sends an
    autoscaling policy: where it is loaded, nothing of the application is imported."""
    module = sys.modules.get(getattr(value.value, "__module__", None) or "")
    register = (
        module is not None
        and _importable(module, _registered_by_value())
        and module.__name__.partition(".")[0] != "app_toolkit"
    )
    if register:
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    try:
        return dumps(value.value)
    finally:
        if register:
            cloudpickle.unregister_pickle_by_value(module)  # type: ignore[no-untyped-call]


#: How deep :func:`_cannot_write` follows a value's parts to the one that cannot be written.
_MAX_DEPTH = 64


def _cannot_write(value: object, exc: Exception) -> str:
    """Why ``value`` cannot be written, naming the part that cannot (an attribute path
    from ``value``) and, when that part is inside an app copied by value, the fix."""
    places = _module_attributes(_app_types())
    path, copied_app = _path_to_unwritable(value, places)
    message = f"Cannot serialize {_spelled(value, [])}: {exc}"
    if path:
        message += f" (the {type(path[-1][1]).__name__} at {_spelled(value, path)})"
    if copied_app is not None:
        kind, where = copied_app
        message += (
            f". It is inside {where} (a {kind}), which is copied because it is not an "
            "attribute of an importable module: define the app (for tk.App(router), the router; "
            "for @ingress(app), the class too: its copy of the app goes with it) at module level "
            "of an importable module, so replicas import it, or build the app on the replica "
            "with a builder function (@ingress(make_app), or an import path naming the builder)"
        )
    return message


def _path_to_unwritable(
    value: object, places: dict[int, tuple[str, str]]
) -> tuple[list[tuple[str, object]], tuple[str, str] | None]:
    """The steps (``(".name" or "[key]", part)``) from ``value`` down to the innermost part
    that cannot be written, and the first app or router copied on the way (its kind
    and where it is): the outermost one, which the user made."""
    kinds = _app_types()
    path: list[tuple[str, object]] = []
    copied_app: tuple[str, str] | None = None
    seen = {id(value)}
    current = value
    for _ in range(_MAX_DEPTH):
        for step, part in _parts_of(current):
            if id(part) in seen or _writes(part, places, seen):
                continue
            seen.add(id(part))
            path.append((step, part))
            current = part
            if copied_app is None and kinds and issubclass(type(part), kinds):
                copied_app = (type(part).__name__, _spelled(value, path))
            break
        else:
            break  # no part fails alone: ``current`` itself is what cannot be written
    return path, copied_app


class _Probe(_Pickler):
    """Writes a part as :class:`_Pickler` would, leaving out the parts it is inside of (a
    part that refers back to one of them does not fail for their sake)."""

    def __init__(self, places: dict[int, tuple[str, str]], outer: set[int]) -> None:
        super().__init__(io.BytesIO(), places)
        self._outer = outer

    def persistent_id(self, obj: object) -> int | None:
        return id(obj) if id(obj) in self._outer else None


def _writes(part: object, places: dict[int, tuple[str, str]], outer: set[int]) -> bool:
    try:
        _Probe(places, outer).dump(part)  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001 - any failure: this part is on the way
        return False
    return True


def _parts_of(obj: object) -> list[tuple[str, object]]:
    """What pickling ``obj`` writes: a class's or object's attributes, a function's
    closure and defaults, a container's items."""
    if isinstance(obj, dict):
        return [(f"[{key!r}]", item) for key, item in obj.items()]
    if isinstance(obj, list | tuple | set | frozenset):
        return [(f"[{index}]", item) for index, item in enumerate(obj)]
    if isinstance(obj, types.FunctionType):
        cells = zip(obj.__code__.co_freevars, obj.__closure__ or (), strict=False)
        closure = [(f".<closure {name}>", cell.cell_contents) for name, cell in cells]
        return [*closure, (".__defaults__", obj.__defaults__), (".__kwdefaults__", obj.__kwdefaults__)]
    attributes = getattr(obj, "__dict__", None)
    if isinstance(attributes, dict | types.MappingProxyType):
        return [
            (f".{name}", item) for name, item in attributes.items() if name not in ("__dict__", "__weakref__")
        ]
    return []


def _spelled(value: object, path: list[tuple[str, object]]) -> str:
    root = value.__name__ if isinstance(value, type) else type(value).__name__
    return root + "".join(step for step, _ in path)
