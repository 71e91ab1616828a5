"""How the Ray backend writes user code and data (deployment definitions, handle
arguments, results, stream items): the C pickler where it writes what cloudpickle would,
cloudpickle elsewhere."""

from __future__ import annotations

import dataclasses
import io
import pickle
import sys
import threading
import types
import typing
from typing import Any

from ray import cloudpickle
from starlette.datastructures import State

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


def _fastapi_unset() -> object:
    from fastapi.datastructures import _Unset  # only where a FastAPI app is unpickled

    return _Unset


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, plus fresh locks and Starlette ``State`` (FastAPI apps hold both), and
    FastAPI's "not given" marker kept as the one it is compared with (``is``): a copy of
    it would read as a given ``example`` and put ``"example": {}`` into the OpenAPI."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=5)  # type: ignore[no-untyped-call]
        fastapi = sys.modules.get("fastapi.datastructures")  # no FastAPI app without it
        self._unset = getattr(fastapi, "_Unset", self)

    def reducer_override(self, obj: object) -> Any:
        # A type reduced here must also stop the C pickler's attempt (_Plain, _REDUCED).
        if obj is self._unset:
            return (_fastapi_unset, ())
        if type(obj) is _LOCK_TYPES[0]:
            return (threading.Lock, ())
        if type(obj) is _LOCK_TYPES[1]:
            return (threading.RLock, ())
        if type(obj) is State:
            return (State, (dict(obj._state),))
        return super().reducer_override(obj)  # type: ignore[no-untyped-call]


class _WrittenOtherwise(Exception):
    """Raised by :class:`_Plain` for what cloudpickle must write."""


class _Plain(pickle.Pickler):
    """The C pickler, stopping at what cloudpickle (with :class:`_Pickler`'s reducers)
    writes differently from it: a class or function of the driver's script (cloudpickle
    writes it by value; a ``TypeVar`` of it too, which the C pickler would write by
    name), Starlette's ``State``, FastAPI's ``DefaultPlaceholder``, the markers of
    dataclass fields (cloudpickle keeps them the objects ``dataclasses`` compares with).
    What the C pickler cannot write at all (a lambda, a lock, a module, a file) it
    refuses by itself. Builtin values (str, bytes, numbers, containers) never reach
    ``reducer_override``, so a large array or list costs nothing extra."""

    def reducer_override(self, obj: object) -> Any:
        if isinstance(obj, (type, types.FunctionType)):
            if getattr(obj, "__module__", None) in (None, "__main__"):
                raise _WrittenOtherwise
        elif type(obj) in _REDUCED or _is_placeholder(obj):
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
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to fix
        raise TypeError(f"Cannot serialize {type(value).__name__}: {exc}") from None
    return buffer.getvalue()
