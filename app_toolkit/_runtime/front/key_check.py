"""The API key check at the front door: which key a request presents, and its holder's name.

A key arrives as ``Authorization: Bearer <key>`` (OpenAI's clients) or ``X-API-Key: <key>``
(``scope.read_headers`` reads both in its one pass over the headers). The check hashes
what was presented and looks the hash up: the same work for a right key, a wrong one, a
malformed header and none (a missing key hashes the empty string). The keys come from
``http_options.api_keys`` and ``api_keys_file``; the file is read again when its
modification time or size changes, looked at no more than once a second, and a file that
turns bad keeps the keys read before it (logged once per change).

Refusals are 401 in OpenAI's error shape with ``WWW-Authenticate: Bearer``, one message for
every reason, so a caller learns nothing about which keys exist. No key, hash or header
value goes into a log line: only the file's path and what is wrong with it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from app_toolkit import metrics
from app_toolkit._runtime.answers import json_answer
from app_toolkit._runtime.front.scope import API_KEY_NAME, RequestHeaders
from app_toolkit._runtime.messages import HTTPResponse
from app_toolkit.config import HTTPOptions, api_keys
from app_toolkit.config.api_keys import APIKey, check_unique, read_keys_file
from app_toolkit.exceptions import ConfigError

logger = logging.getLogger("app_toolkit.proxy")

#: Seconds between two looks at the keys file's modification time.
FILE_CHECK_S = 1.0

REFUSED = metrics.Counter(
    "app_toolkit_api_key_refusals_total",
    "Requests refused for a missing, malformed, unknown or expired API key (401).",
)
ADMITTED = metrics.Counter(
    "app_toolkit_api_key_requests_total",
    "Requests and WebSockets an API key let in, by the key's name.",
    ("key",),
)

_BEARER = b"bearer "
_MESSAGE = "Missing or invalid API key: send it as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'."


@dataclass(frozen=True, slots=True)
class _Holder:
    name: str
    expires_s: float | None


class KeyRing:
    """The keys one front accepts, by the SHA-256 of each, kept up to date with the file."""

    def __init__(self, http: HTTPOptions) -> None:
        self._given = http.api_keys
        self._path = http.api_keys_file
        self._by_digest: dict[bytes, _Holder] = {}
        self._file_state: tuple[int, int] | None = None  # (mtime_ns, size) of the file last read
        self._next_look = 0.0
        self._load(self._given)
        self._look_at_file()

    def admits(self, scope: MutableMapping[str, Any], headers: RequestHeaders, keyless: bool) -> bool:
        """Whether the request may go on to its app: it presents a valid key (whose name
        goes into ``scope`` for the app: ``api_key_name``), or its route is open."""
        name = self.holder(headers)
        if name is not None:
            scope[API_KEY_NAME] = name
            ADMITTED.inc(name)
            return True
        if not keyless:
            REFUSED.inc()
        return keyless

    def holder(self, headers: RequestHeaders) -> str | None:
        """The name of the key the request presents, or None: no key, a malformed header,
        an unknown or an expired key (the same steps for each)."""
        now = time.monotonic()
        if now >= self._next_look:
            self._look_at_file(now)
        authorization = headers.authorization
        if authorization is not None:
            well_formed = authorization[:7].lower() == _BEARER
            presented = authorization[7:].strip(b" \t") if well_formed else authorization
        else:
            presented = headers.api_key if headers.api_key is not None else b""
            well_formed = headers.api_key is not None
        found = self._by_digest.get(api_keys.digest_of(presented))
        if found is None or not well_formed:
            return None
        if found.expires_s is not None and found.expires_s <= time.time():
            return None
        return found.name

    def _look_at_file(self, now: float | None = None) -> None:
        self._next_look = (now if now is not None else time.monotonic()) + FILE_CHECK_S
        if self._path is None:
            return
        try:
            info = os.stat(self._path)
        except OSError as exc:
            self._keep_old((-1, -1), f"cannot be read ({exc.strerror})")
            return
        state = (info.st_mtime_ns, info.st_size)
        if state == self._file_state:
            return
        try:
            from_file = read_keys_file(self._path)
            check_unique((*self._given, *from_file))
        except (ConfigError, ValueError) as exc:
            self._keep_old(state, str(exc))
            return
        self._file_state = state
        self._load((*self._given, *from_file))
        logger.info("API keys: %d from %s and the options", len(self._by_digest), self._path)

    def _keep_old(self, state: tuple[int, int], why: str) -> None:
        if state != self._file_state:  # logged once per change
            self._file_state = state
            logger.error("The API keys file %s %s; the keys read before stay in use", self._path, why)

    def _load(self, keys: tuple[APIKey, ...]) -> None:
        self._by_digest = {key.digest: _Holder(key.name, key.expires_s) for key in keys}


def unauthorized(request_id: str) -> HTTPResponse:
    """401 in OpenAI's error shape, with ``WWW-Authenticate: Bearer``."""
    error = {"message": _MESSAGE, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
    return json_answer(401, {"error": error}, request_id, ((b"www-authenticate", b"Bearer"),))
