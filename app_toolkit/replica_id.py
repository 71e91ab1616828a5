"""A replica's id: the string status(), logs and metrics show, which is also Ray Serve's
``ReplicaID`` (``unique_id``, ``deployment_id``) for code that reads it as one."""

from __future__ import annotations

from app_toolkit.deployment_id import DeploymentID

__all__ = ["ReplicaID"]

#: What Ray Serve's ``ReplicaID.to_full_id_str()`` starts with.
_FULL_ID_PREFIX = "SERVE_REPLICA::"


class ReplicaID(str):
    """The id of one replica of ``deployment_id``.

    A ``str`` (``"shop.Model.3f2a9c"``, compared, hashed and printed as that string, as
    it always was here) with Ray Serve's ``ReplicaID`` fields: ``unique_id``, the part
    unique within the deployment (``"3f2a9c"``), and ``deployment_id`` (``.name``,
    ``.app_name``). ``str()`` is the id itself, not Ray Serve's ``Replica(id=...)`` text.
    """

    _fields: tuple[str, DeploymentID]  # a str subclass cannot have slots of its own

    def __new__(cls, replica_id: str, deployment_id: DeploymentID) -> ReplicaID:
        self = super().__new__(cls, replica_id)
        # The controller names replicas "<app>.<deployment>.<hex>"; other ids (tests,
        # adopted replicas) are unique as they are.
        unique = replica_id.removeprefix(f"{deployment_id.app}.{deployment_id.name}.") or replica_id
        self._fields = (unique, deployment_id)
        return self

    @property
    def unique_id(self) -> str:
        """Unique among the replicas of its deployment (Ray Serve's ``unique_id``)."""
        return self._fields[0]

    @property
    def deployment_id(self) -> DeploymentID:
        """The deployment it is a replica of."""
        return self._fields[1]

    def to_full_id_str(self) -> str:
        """Ray Serve's full form: ``SERVE_REPLICA::<app>#<deployment>#<unique_id>``."""
        deployment = self.deployment_id
        app = f"{deployment.app}#" if deployment.app else ""
        return f"{_FULL_ID_PREFIX}{app}{deployment.name}#{self.unique_id}"

    def __reduce__(self) -> tuple[type[ReplicaID], tuple[str, DeploymentID]]:
        return ReplicaID, (str(self), self.deployment_id)
