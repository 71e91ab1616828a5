"""How a process starts, joins or finds the toolkit on Ray (the backend table's entry)."""

from __future__ import annotations

import os

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from app_toolkit._runtime.backends.ray.actors import ControllerActor
from app_toolkit._runtime.backends.ray.cluster import (
    CONTROLLER_NAME,
    NAMESPACE,
    controller_actor,
    head_node_id,
    init_ray,
    remote,
)
from app_toolkit._runtime.backends.ray.link import RayLink
from app_toolkit._runtime.backends.ray.spares import spare_setting
from app_toolkit._runtime.session import Session
from app_toolkit.config import HTTPOptions
from app_toolkit.config.schema import SECRET_OPTIONS
from app_toolkit.exceptions import ConfigError


class _RayFactory:
    def start(self, address: str | None, http: HTTPOptions | None) -> Session:
        """Join or start Ray, then find or start the controller and its proxies.

        Inside an actor (a replica's user code calling a handle) with no ``http``: attach
        to the running controller without blocking calls.
        """
        if http is None and ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
            return Session(RayLink(controller_actor()))
        spare_setting()  # a bad setting fails here, with how to fix it, before Ray starts
        init_ray(address)
        # The controller (and a HeadOnly proxy) lives on the head node: the node whose loss
        # ends the cluster anyway, so worker nodes can come and go.
        controller = remote(
            ControllerActor,
            name=CONTROLLER_NAME,
            namespace=NAMESPACE,
            lifetime="detached",
            max_restarts=-1,
            get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id(), soft=False),
        ).remote(http or HTTPOptions())
        running = ray.get(controller.http_options.remote())
        if http is not None and running != http:
            differ = [
                name for name in HTTPOptions.model_fields if getattr(running, name) != getattr(http, name)
            ]
            shown = {name: getattr(running, name) for name in differ if name not in SECRET_OPTIONS}
            raise ConfigError(
                f"The toolkit already runs with other HTTP options ({', '.join(differ)}: {shown} there); "
                "shut it down first (app-toolkit shutdown) to use these"
            )
        ray.get(controller.ready.remote())
        return Session(RayLink(controller))

    def find(self, address: str | None) -> Session | None:
        """The running toolkit on the cluster, or None (never starts anything)."""
        if not ray.is_initialized():
            if address is None and not os.environ.get("RAY_ADDRESS"):
                return None
            init_ray(address)
        try:
            return Session(RayLink(controller_actor()))
        except ValueError:
            return None


FACTORY = _RayFactory()
