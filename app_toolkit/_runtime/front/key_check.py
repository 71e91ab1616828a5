"""The API key check at the front door: which key a request presents, and its holder's name.

A key arrives as ``Authorization: Bearer <key>`` (OpenAI's clients) or ``X-API-Key: <key>``
(``scope.read_headers`` reads both in its one pass over the headers; either sent twice
opens nothing). A request that sends neither, over an HTTPS connection whose client
certificate a key's ``client_cert`` names (``ssl_ca_certs`` verified it in the handshake),
is that key's. The check hashes what was presented and looks the hash up: the same work
for a right key, a wrong one, a malformed header and none (a missing key hashes the empty
string). The keys come from ``http_options.api_keys`` and ``api_keys_file``. The file is
looked at no more than once a second and read again when it changed (its inode, size or
times); a file that no longer parses keeps the keys read before it, and a file that is
gone takes its keys with it. Both are logged once per change.

Under direct ingress the proxy's acceptor asks :meth:`KeyRing.opens` of a connection's
first request, peeked, before it hands the connection to a replica: a caller without a
valid key is answered by the proxy and reaches no replica process.

A CORS preflight carries no key (browsers send none with it): with keys on, the front
answers it by the app's own ``CORSMiddleware`` policy (:func:`preflight`), before the key
check, and it reaches no app. An app without one gets a 401 for it. The front's refusals
(the 401 here, a key's 429) carry the headers that policy gives other answers
(:func:`with_cors`), so a page of another origin can read them.

Refusals are 401 in OpenAI's error shape with ``WWW-Authenticate: Bearer``, one message for
every reason, so a caller learns nothing about which keys exist. No key, hash or header
value goes into a log line: only the file's path and what is wrong with it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import Message, Scope

from app_toolkit import metrics
from app_toolkit._runtime.answers import json_answer
from app_toolkit._runtime.front.rate_limits import Limits
from app_toolkit._runtime.front.scope import (
    API_KEY_METERED,
    API_KEY_NAME,
    CLIENT_CERT,
    RequestHeaders,
)
from app_toolkit._runtime.messages import HTTPResponse
from app_toolkit._runtime.request_values import API_KEY_SHARE, Share
from app_toolkit.config import HTTPOptions
from app_toolkit.config.api_keys import (
    UNAUTHORIZED_MESSAGE,
    APIKey,
    check_unique,
    digest_of,
    key_headers,
    presented_key,
    read_keys_file,
)
from app_toolkit.exceptions import ConfigError

logger = logging.getLogger("app_toolkit.proxy")

#: Seconds between two looks at the keys file.
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

#: What identifies the keys file's content on disk: an edit or a replacement changes it.
_FileState = tuple[int, int, int, int]
_GONE: _FileState = (-1, -1, -1, -1)


@dataclass(frozen=True, slots=True)
class Holder:
    name: str
    expires_s: float | None
    share: Share


class KeyRing:
    """The keys one front accepts, by the SHA-256 of each, kept up to date with the file.
    ``digest``: how a presented key is hashed (tests count its calls)."""

    def __init__(self, http: HTTPOptions, digest: Callable[[bytes], bytes] = digest_of) -> None:
        self._given = http.api_keys
        self._cert_reqs = http.ssl_cert_reqs
        self._path = http.api_keys_file
        self._digest = digest
        self._by_digest: dict[bytes, Holder] = {}
        self._by_name: dict[str, Holder] = {}
        self._by_cert: dict[str, Holder] = {}
        self._limits: dict[str, Limits] = {}
        self._file_state: _FileState | None = None  # the file as last looked at
        self._next_look = 0.0
        self._load(())
        self._look_at_file()

    def admits(self, scope: MutableMapping[str, Any], headers: RequestHeaders, keyless: bool) -> bool:
        """Whether the request may go on to its app: it presents a valid key, or sends none
        over a connection whose client certificate names one (the key's name goes into
        ``scope`` for the app, ``api_key_name``, with its share for the queues the request
        and its handle calls wait in), or its route is open."""
        found = self._holder(headers.authorization, headers.api_key)
        if found is None and self._by_cert and headers.authorization is None and headers.api_key is None:
            found = self._live(self._by_cert.get(scope.get(CLIENT_CERT, "")))
        if found is not None:
            self.let_in(scope, found)
            return True
        if not keyless:
            REFUSED.inc()
        return keyless

    def named(self, name: str) -> Holder | None:
        """The key named ``name`` (for an open route whose app identified its caller by
        its own means: ``app_toolkit.admit_key``), or None: no such key, or it expired."""
        self._refresh()
        return self._live(self._by_name.get(name))

    def let_in(self, scope: Scope, found: Holder) -> None:
        """The request is ``found``'s: its name and share go into ``scope``."""
        scope[API_KEY_NAME] = found.name
        scope[API_KEY_SHARE] = found.share
        ADMITTED.inc(found.name)

    def limits_of(self, name: str) -> Limits | None:
        """The limits of the key named ``name`` (None: none)."""
        return self._limits.get(name) if self._limits else None

    def limits(self, scope: Scope) -> Limits | None:
        """The limits of the key :meth:`admits` found for this request (None: none); a key
        with a tokens limit is marked in ``scope``, so that its tokens are charged."""
        found = self.limits_of(scope.get(API_KEY_NAME, ""))
        self.meter(scope, found)
        return found

    @staticmethod
    def meter(scope: Scope, limits: Limits | None) -> None:
        """Mark ``scope`` as its key's whose tokens are charged: the key has a tokens limit."""
        if limits is not None and limits.tokens:
            scope[API_KEY_METERED] = True

    def opens(self, head: bytes) -> bool:
        """Whether the request head at the start of ``head`` (peeked bytes: its request
        line and headers, whole) presents a valid key. False for a head that is not whole:
        the proxy serves that connection, whose front checks it."""
        end = head.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = (line.partition(b":") for line in head[:end].split(b"\r\n")[1:])
        authorization, api_key = key_headers((name.lower(), value.strip(b" \t")) for name, _, value in lines)
        return self._holder(authorization, api_key) is not None

    def holder(self, authorization: bytes | None, api_key: bytes | None) -> str | None:
        """The name of the key presented in these headers' values, or None: no key, a
        malformed header, an unknown or an expired key (the same steps for each)."""
        found = self._holder(authorization, api_key)
        return found.name if found is not None else None

    def _holder(self, authorization: bytes | None, api_key: bytes | None) -> Holder | None:
        self._refresh()
        presented, well_formed = presented_key(authorization, api_key)
        found = self._by_digest.get(self._digest(presented))
        return self._live(found) if well_formed else None

    @staticmethod
    def _live(found: Holder | None) -> Holder | None:
        """``found``, unless it has expired."""
        if found is None or (found.expires_s is not None and found.expires_s <= time.time()):
            return None
        return found

    def _refresh(self) -> None:
        """Look at the keys file, if it is time to."""
        now = time.monotonic()
        if now >= self._next_look:
            self._look_at_file(now)

    def _look_at_file(self, now: float | None = None) -> None:
        self._next_look = (now if now is not None else time.monotonic()) + FILE_CHECK_S
        if self._path is None:
            return
        try:
            info = os.stat(self._path)
        except OSError as exc:
            if self._file_state != _GONE:
                self._file_state = _GONE
                self._load(())
                logger.error(
                    "The API keys file %s cannot be read (%s): its keys are revoked", self._path, exc.strerror
                )
            return
        state = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        if state == self._file_state:
            return
        self._file_state = state  # logged once per change, whatever comes of it
        try:
            from_file = read_keys_file(self._path)
            check_unique((*self._given, *from_file))
        except (ConfigError, ValueError) as exc:
            logger.error("%s; the keys read before it stay in use", exc)
            return
        self._load(from_file)
        logger.info("API keys: %d from %s and the options", len(self._by_digest), self._path)
        if not self._cert_reqs and any(key.client_cert for key in from_file):
            logger.error(
                "API keys in %s are named by client certificates (client_cert), but HTTPS asks "
                "for none (ssl_ca_certs, ssl_cert_reqs): no certificate names them",
                self._path,
            )

    def _load(self, from_file: tuple[APIKey, ...]) -> None:
        keys = (*self._given, *from_file)
        self._by_digest = {
            key.digest: Holder(key.name, key.expires_s, Share(key.name, key.weight, key.priority))
            for key in keys
        }
        self._by_name = {holder.name: holder for holder in self._by_digest.values()}
        self._by_cert = {key.client_cert: self._by_name[key.name] for key in keys if key.client_cert}
        self._limits = {key.name: limits for key in keys if (limits := Limits.of(key)) is not None}


def preflight(scope: Scope, policy: CORSMiddleware | None) -> HTTPResponse | None:
    """The answer to a CORS preflight (``OPTIONS`` with ``Origin`` and
    ``Access-Control-Request-Method``) by the app's own CORS policy, as its middleware would
    give it; None for any other request, or an app without a policy. A browser sends no
    key with a preflight, so with keys on the front answers it and it reaches no app."""
    if policy is None:
        return None
    headers = Headers(scope=scope)
    if "origin" not in headers or "access-control-request-method" not in headers:
        return None
    response = policy.preflight_response(request_headers=headers)
    return HTTPResponse(response.status_code, response.raw_headers, bytes(response.body))


async def with_cors(answer: HTTPResponse, scope: Scope, policy: CORSMiddleware | None) -> HTTPResponse:
    """``answer`` (the front's 401 or 429) with the headers the app's CORS policy adds to
    an answer to a request from another origin, by the policy's own code: a browser page
    reads the refusal as it would the app's own answer."""
    if policy is None:
        return answer
    request_headers = Headers(scope=scope)
    if "origin" not in request_headers:
        return answer
    sent: list[Message] = []

    async def keep(message: Message) -> None:
        sent.append(message)

    start = {"type": "http.response.start", "status": answer.status, "headers": list(answer.headers)}
    await policy.send(start, keep, request_headers)
    return HTTPResponse(answer.status, sent[0]["headers"], answer.body)


def unauthorized(request_id: str) -> HTTPResponse:
    """401 in OpenAI's error shape, with ``WWW-Authenticate: Bearer``."""
    error = {
        "message": UNAUTHORIZED_MESSAGE,
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    return json_answer(401, {"error": error}, request_id, ((b"www-authenticate", b"Bearer"),))
