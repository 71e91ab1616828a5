"""The controller's checkpoint: the desired state a restarted controller takes back
(applications, the config file last applied and its target capacity, the traffic
policies) and each deployment's lifecycle (a failed version and what it falls back on,
an upgrade under way). Written as a versioned mapping: a checkpoint of another layout is
refused rather than misread."""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass

from app_toolkit._runtime.controller.api import ConfigFile
from app_toolkit._runtime.controller.capacity import Capacity
from app_toolkit._runtime.controller.deployment_state import Lifecycle
from app_toolkit._runtime.controller.traffic import SavedPolicy
from app_toolkit._runtime.messages import AppSpec, DeploymentID

logger = logging.getLogger("app_toolkit.controller")

#: The layout written now; a checkpoint of any other is ignored (and said so).
FORMAT = 2


@dataclass(frozen=True)
class Checkpoint:
    """What a controller saves, and a restarted one takes back."""

    apps: dict[str, AppSpec]
    applied_file: ConfigFile | None
    capacity: Capacity
    lifecycles: dict[DeploymentID, Lifecycle]
    policy: SavedPolicy

    def dumps(self) -> bytes:
        return pickle.dumps({"format": FORMAT, "checkpoint": self})

    def in_file(self) -> set[str]:
        """The applications the applied config file deployed (they run at its capacity)."""
        applications = (self.applied_file or {}).get("applications", [])
        return {app.get("name", "default") for app in applications}


def loads(data: bytes | None) -> Checkpoint | None:
    """The checkpoint in ``data``; None for none, or for one of another layout."""
    if not data:
        return None
    try:
        saved = pickle.loads(data)
    except Exception as exc:  # noqa: BLE001 - a class renamed since, say: as another layout
        logger.warning("Ignoring a checkpoint this version of app_toolkit cannot read (%s)", exc)
        return None
    if isinstance(saved, dict) and saved.get("format") == FORMAT:
        checkpoint: Checkpoint = saved["checkpoint"]
        return checkpoint
    logger.warning("Ignoring a checkpoint written by another version of app_toolkit")
    return None
