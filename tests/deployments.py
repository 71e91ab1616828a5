"""Decorated classes as the deployments they are, for mypy.

``@tk.deployment`` turns a class into a :class:`~app_toolkit.Deployment`, but mypy ignores
what a class decorator returns and keeps the class's own type (python/mypy#3135), so
``Model.bind()`` does not type-check. ``as_deployment(Model).bind()`` does; decorated
functions need no help.
"""

from __future__ import annotations

from app_toolkit.deployment import Deployment


def as_deployment(decorated: object) -> Deployment:
    """``decorated`` (a class under ``@tk.deployment``), typed as the Deployment it is."""
    assert isinstance(decorated, Deployment), f"{decorated!r} is not a deployment"
    return decorated
