"""FastAPI beyond its documented API: the internals the toolkit reads, through the
functions here, and where the releases in pyproject.toml's range (``fastapi>=0.133``) differ.

Each entry: the internal, what the toolkit uses it for, the releases that have it, and
the releases it was checked on.

- ``fastapi.datastructures._Unset``: the "not given" marker FastAPI compares with ``is``
  (a copy of it in a replica would read as given: ``"example": {}`` in the OpenAPI).
  From 0.136; before, parameters use pydantic's ``PydanticUndefined``, a singleton that
  pickles as itself. Checked on 0.133.0 and 0.165.0.
- ``fastapi.routing._IncludedRouter`` (its ``original_router``): an included router
  travels as the router it includes and is made again in the replica. From 0.137;
  before, ``include_router`` copies the routes in and each travels as it is. Checked on
  0.133.0 and 0.165.0.

Nothing here imports FastAPI: a process that has no FastAPI app loaded has nothing to
look up (``sys.modules`` is read instead).
"""

from __future__ import annotations

import sys


def unset_marker() -> object | None:
    """FastAPI's "not given" marker, if this FastAPI has one and it is loaded."""
    return getattr(sys.modules.get("fastapi.datastructures"), "_Unset", None)


def load_unset_marker() -> object:
    """The marker, in the process that unpickles an app that held it (so FastAPI has it)."""
    from fastapi.datastructures import _Unset  # only where a FastAPI app is unpickled

    return _Unset


def included_router_type() -> type | None:
    """The class that keeps an included router whole, if this FastAPI has one and it is loaded."""
    found = getattr(sys.modules.get("fastapi.routing"), "_IncludedRouter", None)
    return found if isinstance(found, type) else None


def included_router(route: object) -> object | None:
    """The router a route entry includes whole (FastAPI >= 0.137), else None."""
    return getattr(route, "original_router", None)
