"""Errors of the Ray backend that Ray Serve programs catch as Ray's own exceptions."""

from __future__ import annotations

from ray.exceptions import RayActorError

from app_toolkit.exceptions import RequestLostError


class RayRequestLostError(RequestLostError, RayActorError):
    """:class:`~app_toolkit.RequestLostError` on Ray: also a ``ray.exceptions.RayActorError``,
    which Ray Serve raises for a call whose replica died with it, so code written for Ray
    Serve (``except RayActorError``) catches it; ``except RequestLostError`` still does.
    Pickles as ``(message,)``, like its parent."""

    def __init__(self, message: str = "") -> None:
        # RayActorError's own fields (it never calls Exception.__init__; args stay
        # (message,) from the constructor call, which pickling repeats).
        RayActorError.__init__(self, error_msg=message)
