"""The controller's API: every control verb, written once.

``ControllerCore`` implements it; every other process reaches it through a
:class:`~app_toolkit._runtime.session.Session`, whose link (an actor call on Ray, the
loop in this process) carries a :data:`ControlCall`: a function of the API, which mypy
checks like any other call. A new verb is a method here and one in the core.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from app_toolkit._runtime.messages import AppSpec
from app_toolkit._runtime.quotas import Charges, QuotaAsk, QuotaGrant
from app_toolkit._runtime.tables import Loads, Outcomes, Updates, Versions
from app_toolkit.config import RolloutOptions
from app_toolkit.status import ServeStatus

T = TypeVar("T")

#: A config file as it was written (``app-toolkit deploy``), kept to show it again.
ConfigFile = dict[str, Any]


class ControllerAPI(Protocol):
    """What any process may ask of the controller."""

    async def deploy_apps(self, specs: list[AppSpec]) -> None:
        """Run ``specs`` (each replacing the application of its name), all in one step;
        returns once checkpointed."""
        ...

    async def delete_app(self, name: str) -> None: ...

    async def apply_config(self, specs: list[AppSpec], config_file: ConfigFile) -> None:
        """Run exactly these applications (others are deleted); remember the file."""
        ...

    async def config_file(self) -> ConfigFile | None:
        """The config file last applied, less the applications changed since by hand."""
        ...

    async def set_traffic(self, endpoint: str, weights: dict[str, float]) -> None: ...

    async def rollout(self, endpoint: str, canary: str, options: RolloutOptions) -> None: ...

    async def shadow(self, endpoint: str, to: str | None, fraction: float, compare: str = "") -> None: ...

    async def status(self) -> ServeStatus: ...

    async def app_exists(self, name: str) -> bool:
        """False once ``name`` is deleted and all its replicas have stopped."""
        ...

    async def listen(self, known: Versions, timeout_s: float) -> Updates:
        """The tables newer than ``known`` (a long poll of a caller's data plane)."""
        ...

    async def record_load(self, caller: str, loads: Loads, outcomes: Outcomes = ()) -> None:
        """A caller's load per deployment, and what its traffic policies saw."""
        ...

    async def take_quota(
        self, front: str, asks: tuple[QuotaAsk, ...], charges: Charges = ()
    ) -> tuple[QuotaGrant, ...]:
        """Charge tokens to keys, and what API keys' limits leave for ``front``'s asks
        (``_runtime/quotas.py``)."""
        ...

    async def record_models(self, replica_id: str, models: tuple[str, ...], sequence: int) -> None:
        """The multiplexed models a replica holds now (its ``sequence``-th report)."""
        ...

    async def shutdown(self) -> None:
        """Stop every application and the proxies, then the controller's own loop."""
        ...


#: One request to the controller, as a link carries it: ``lambda c: c.delete_app(name)``.
ControlCall = Callable[[ControllerAPI], Awaitable[T]]
