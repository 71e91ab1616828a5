"""The name of one deployment inside one application: what the controller, callers and
replicas key deployments by, and what an application's autoscaling policy receives
(``app_toolkit.autoscaling_policy``, Ray Serve's ``DeploymentID``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DeploymentID"]


@dataclass(frozen=True, slots=True)
class DeploymentID:
    """Names one deployment inside one application."""

    app: str
    name: str

    def __str__(self) -> str:
        return f"{self.app}/{self.name}"

    @property
    def app_name(self) -> str:
        """The application's name (Ray Serve's spelling, for autoscaling policies)."""
        return self.app

    def __reduce__(self) -> tuple[type[DeploymentID], tuple[str, str]]:
        # Pickled as its two fields, as ``_runtime/compact.py`` pickles the messages
        # (this module sits below the runtime, so it spells that out): tables hold many.
        return DeploymentID, (self.app, self.name)
