"""Cheaper pickling for the frozen dataclasses that cross processes.

A slotted dataclass pickles through ``__getstate__``, which calls ``dataclasses.fields``
on every object: most of the cost of sending a table of replicas to hundreds of callers
(measured in ``benchmarks/scale.py``). ``compact`` gives the class a ``__reduce__`` that
reads every field at once and rebuilds the object through its constructor.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def compact(cls: type[T]) -> type[T]:
    """Pickle ``cls`` (a dataclass whose fields are all constructor arguments) as its
    class and a tuple of its field values, in order."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = [f.name for f in fields if f.init]
    if len(names) != len(fields):
        raise TypeError(f"{cls.__name__}: every field must be an __init__ argument to be compact")
    getter: Callable[[object], tuple[object, ...]]
    if not names:
        getter = lambda obj: ()  # noqa: E731
    elif len(names) == 1:
        single = operator.attrgetter(names[0])
        getter = lambda obj: (single(obj),)  # noqa: E731
    else:
        getter = operator.attrgetter(*names)

    def __reduce__(self: object) -> tuple[type[T], tuple[object, ...]]:
        return cls, getter(self)

    cls.__reduce__ = __reduce__  # type: ignore[method-assign]
    return cls
