"""Model multiplexing: many models served by one deployment, each replica holding a few.

``@multiplexed(max_num_models_per_replica=N)`` on an async loader method makes it a
per-replica cache: ``await self.get_model(model_id)`` returns the loaded model, loading it
once however many requests ask for it at the same time, and evicting the least recently
used model when a new one needs the slot. The replica tells the controller which models
it holds, and callers (proxies and handles) send a request for a model to a replica that
holds it when one has a free slot. A request names its model with the
``serve_multiplexed_model_id`` HTTP header (or ``serve-multiplexed-model-id``, the form
proxies that refuse underscores pass on) or ``handle.options(multiplexed_model_id=...)``;
``get_multiplexed_model_id()`` reads it inside the replica. Ray Serve's names and meanings.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar, overload

from app_toolkit import metrics
from app_toolkit._runtime import request_context, request_keys
from app_toolkit.exceptions import ConfigError, DefinitionError

logger = logging.getLogger("app_toolkit.multiplex")

M = TypeVar("M")

MODEL_ID_HEADER = request_keys.MODEL_ID_HEADER.decode()


def get_multiplexed_model_id() -> str:
    """The model the current request asks for ("" when it names none)."""
    return request_context.current_model_id()


MODEL_LOADS = metrics.Counter(
    "app_toolkit_multiplexed_model_loads_total", "Models a @multiplexed loader loaded", ("loader", "outcome")
)
MODEL_LOAD_SECONDS = metrics.Histogram(
    "app_toolkit_multiplexed_model_load_seconds", "How long each successful model load took", ("loader",)
)
MODEL_EVICTIONS = metrics.Counter(
    "app_toolkit_multiplexed_model_evictions_total", "Models evicted to make room for another", ("loader",)
)


class _ModelCache(Generic[M]):
    """One replica's models of one loader: least recently used first."""

    def __init__(self, load: Callable[[str], Awaitable[M]], capacity: int, name: str) -> None:
        self._load = load
        self._capacity = capacity
        self._name = name
        self._models: collections.OrderedDict[str, asyncio.Future[M]] = collections.OrderedDict()
        self._report: Callable[[tuple[str, ...]], None] | None = None

    @property
    def model_ids(self) -> tuple[str, ...]:
        """The models loaded (not loading), least recently used first."""
        return tuple(key for key, model in self._models.items() if model.done() and model.exception() is None)

    async def get(self, model_id: str) -> M:
        if not isinstance(model_id, str) or not model_id:
            raise ValueError(f"{self._name}: the model id must be a non-empty string, got {model_id!r}")
        self._report = request_context.report_models.get() or self._report
        model = self._models.get(model_id)
        if model is None:
            self._make_room()
            model = self._models[model_id] = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().create_task(self._fill(model_id, model))
        else:
            self._models.move_to_end(model_id)
        # Shielded: one caller going away does not cancel a load others wait for.
        return await asyncio.shield(model)

    async def _fill(self, model_id: str, model: asyncio.Future[M]) -> None:
        started = time.perf_counter()
        try:
            loaded = await self._load(model_id)
        except BaseException as exc:  # noqa: BLE001 - every waiter gets the loader's error
            MODEL_LOADS.inc(self._name, "failed")
            if self._models.get(model_id) is model:
                del self._models[model_id]  # the next request tries again
            if not model.done():
                model.set_exception(exc)
            model.exception()  # retrieved: no "never retrieved" warning without waiters
            logger.warning("%s failed to load model %r: %s", self._name, model_id, exc)
            return
        if not model.done():
            model.set_result(loaded)
        MODEL_LOADS.inc(self._name, "ok")
        MODEL_LOAD_SECONDS.observe(time.perf_counter() - started, self._name)
        logger.info("%s loaded model %r", self._name, model_id)
        self._publish()

    def _make_room(self) -> None:
        """Evict least recently used loaded models until one more fits."""
        while len(self._models) >= self._capacity:
            victim = next((key for key, model in self._models.items() if model.done()), None)
            if victim is None:
                return  # every slot is still loading: go over capacity for now
            model = self._models.pop(victim)
            logger.info("%s evicted model %r", self._name, victim)
            MODEL_EVICTIONS.inc(self._name)
            if model.exception() is None:
                asyncio.get_running_loop().create_task(_release(model.result(), victim))
            self._publish()

    async def release_all(self) -> None:
        models, self._models = self._models, collections.OrderedDict()
        while models:
            model_id, model = models.popitem(last=False)
            if model.done() and not model.cancelled() and model.exception() is None:
                await _release(model.result(), model_id)
            else:
                model.cancel()
            del model  # the last reference: a plain __del__ runs now

    def _publish(self) -> None:
        if self._report is not None:
            try:
                self._report(self.model_ids)
            except Exception:
                logger.exception("Could not report the models of %s", self._name)


async def _release(model: object, model_id: str) -> None:
    """Let a model that leaves (evicted, or its replica stops) free what it holds: its
    ``aclose()`` or ``close()``, or an ``async def __del__`` (awaited now, as Ray Serve
    does). A plain ``__del__`` runs once the cache drops its last reference."""
    try:
        aclose = getattr(model, "aclose", None)
        if aclose is not None:
            await aclose()
            return
        close = getattr(model, "close", None)
        if close is not None:
            await asyncio.to_thread(close)
            return
        finalizer = getattr(type(model), "__del__", None)
        if inspect.iscoroutinefunction(finalizer):
            await finalizer(model)
    except Exception:
        logger.exception("Releasing model %r failed", model_id)


class _Multiplexed(Generic[M]):
    """The decorated loader: a descriptor giving each instance its own model cache."""

    def __init__(self, loader: Callable[..., Awaitable[M]], capacity: int) -> None:
        if not inspect.iscoroutinefunction(loader):
            raise DefinitionError(
                f"@multiplexed needs an async loader (async def {loader.__name__}(self, model_id)); "
                "other requests keep being served while a model loads"
            )
        self._loader = loader
        self.capacity = capacity
        self._attribute = f"__app_toolkit_models_{loader.__name__}"
        self._unbound: _ModelCache[M] | None = None
        functools.update_wrapper(self, loader)

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_unbound": None}  # models stay in their process

    def _cache(self, instance: object) -> _ModelCache[M]:
        if instance is None:
            if self._unbound is None:
                self._unbound = _ModelCache(self._loader, self.capacity, self._loader.__qualname__)
            return self._unbound
        cache: _ModelCache[M] | None = instance.__dict__.get(self._attribute)
        if cache is None:
            load = functools.partial(self._loader, instance)
            cache = instance.__dict__[self._attribute] = _ModelCache(
                load, self.capacity, self._loader.__qualname__
            )
            hooks = request_context.stop_hooks.get()
            if hooks is not None:  # in a replica: its models are released when it stops
                hooks.append(cache.release_all)
        return cache

    @overload
    def __get__(self, instance: None, owner: type | None) -> _Multiplexed[M]: ...

    @overload
    def __get__(self, instance: object, owner: type | None) -> Callable[[str], Awaitable[M]]: ...

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return self._cache(instance).get

    async def __call__(self, model_id: str) -> M:
        return await self._cache(None).get(model_id)


@overload
def multiplexed(
    func: Callable[..., Awaitable[M]], /, *, max_num_models_per_replica: int = 3
) -> _Multiplexed[M]: ...


@overload
def multiplexed(
    func: None = None, /, *, max_num_models_per_replica: int = 3
) -> Callable[[Callable[..., Awaitable[M]]], _Multiplexed[M]]: ...


def multiplexed(
    func: Callable[..., Awaitable[M]] | None = None, /, *, max_num_models_per_replica: int = 3
) -> _Multiplexed[M] | Callable[[Callable[..., Awaitable[M]]], _Multiplexed[M]]:
    """Make an async loader ``(self, model_id) -> model`` a per-replica LRU model cache.

    ::

        @tk.multiplexed(max_num_models_per_replica=2)
        async def get_model(self, model_id: str) -> Model:
            return await load(model_id)

        async def __call__(self, request):
            model = await self.get_model(tk.get_multiplexed_model_id())

    ``max_num_models_per_replica=-1`` sets no limit (as in Ray Serve). A value of the wrong
    type raises ``DefinitionError`` (a ``TypeError``), a number below 1 ``ConfigError`` (a
    ``ValueError``), when the decorator runs.
    """
    # Checked here, when the module is imported, in Ray Serve's error types.
    limit = max_num_models_per_replica
    wrong_type = not isinstance(limit, int) or isinstance(limit, bool)
    if wrong_type or (limit < 1 and limit != -1):
        raise (DefinitionError if wrong_type else ConfigError)(
            f"max_num_models_per_replica must be an integer >= 1 (or -1: no limit), got {limit!r}"
        )
    capacity = sys.maxsize if limit == -1 else limit

    def wrap(loader: Callable[..., Awaitable[M]]) -> _Multiplexed[M]:
        return _Multiplexed(loader, capacity)

    return wrap if func is None else wrap(func)
