"""Who is calling: the toolkit's API keys, and the page's sign-in cookie that names one.

Keys are the toolkit's (``http_options.api_keys`` or a keys file: ``app-toolkit run
chat.app:app --api-keys-file keys.yaml``; ``app-toolkit keys new NAME`` makes
one). The toolkit checks them at the front, before this app sees a request, and keeps
each key's limits (requests and tokens per window, requests at once) and share across
every replica: the OpenAI API (``/v1/...``) is served only to a request with a key.

The page never holds a key. It signs in once by sending one to ``/api/session`` (checked
at the front like any) and gets a signed cookie (``HttpOnly``, ``SameSite=Strict``) that
names the key until it expires. The page's own routes are open (``@tk.open_route``):
a request that starts a reply is let in as the cookie's key (``tk.admit_key``), under
that key's limits and with its share, as if it had sent the key; reading or stopping
that reply counts nothing more. The cookie names the key: removing the key's entry
refuses its sign-ins' new replies; giving the name another key does not (change
``session_secret`` to sign everyone out). A page reply's id is bound to the
key that started it (``ReplyIds``): another key's id for it is a reply that does not
exist. With no keys configured everyone is let in as ``""`` and nothing is counted.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import uuid

import app_toolkit as tk
from fastapi import Request
from starlette.requests import HTTPConnection

COOKIE = "chat_session"


class Sessions:
    """Sign-in cookies: ``owner.expiry.signature``, signed with HMAC-SHA256."""

    def __init__(self, secret: bytes, ttl_s: float) -> None:
        self._secret = secret
        self.ttl_s = ttl_s

    def issue(self, owner: str, now: float | None = None) -> str:
        expiry = int((now or time.time()) + self.ttl_s)
        name = base64.urlsafe_b64encode(owner.encode()).decode().rstrip("=")
        return f"{name}.{expiry}.{self._sign(name, expiry)}"

    def owner_of(self, cookie: str, now: float | None = None) -> str | None:
        """The owner a cookie names, or None (forged, altered, expired or malformed)."""
        parts = cookie.split(".")
        if len(parts) != 3 or not parts[1].isdigit() or len(cookie) > 400:
            return None
        name, expiry, signature = parts[0], int(parts[1]), parts[2]
        if not hmac.compare_digest(signature.encode(), self._sign(name, expiry).encode()):
            return None
        if expiry < (now or time.time()):
            return None
        return base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode()

    def _sign(self, name: str, expiry: int) -> str:
        return hmac.new(self._secret, f"{name}.{expiry}".encode(), hashlib.sha256).hexdigest()


class ReplyIds:
    """Page reply ids bound to the caller that started the reply: ``<uuid>.<signature>``,
    the signature an HMAC-SHA256 of the uuid and the owner's name. Reading or stopping a
    reply with an id that does not check out for the caller is answered as for a reply
    that does not exist: knowing an id is not enough to read someone else's reply. (With
    keys off every caller is the same one, and any id checks out for everyone.)"""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def issue(self, owner: str) -> str:
        """A new reply id for ``owner``."""
        nonce = uuid.uuid4().hex
        return f"{nonce}.{self._sign(nonce, owner)}"

    def owns(self, reply_id: str, owner: str) -> bool:
        """Whether ``reply_id`` was issued to ``owner`` (by this deploy's secret)."""
        nonce, _, signature = reply_id.partition(".")
        if len(reply_id) > 100 or not nonce.isalnum() or not signature:
            return False
        return hmac.compare_digest(signature.encode(), self._sign(nonce, owner).encode())

    def _sign(self, nonce: str, owner: str) -> str:
        # "reply:" keeps these apart from the sign-in cookies' signatures (same secret).
        return hmac.new(self._secret, f"reply:{nonce}:{owner}".encode(), hashlib.sha256).hexdigest()[:32]


class Access:
    """The page's sign-in cookies and reply ids, signed with one secret."""

    def __init__(self, secret: bytes, session_ttl_s: float) -> None:
        self.sessions = Sessions(secret, session_ttl_s)
        self.replies = ReplyIds(secret)

    async def admitted(self, request: Request) -> str:
        """The route dependency of the page's routes that start work (a reply): the
        caller's key name ("" with keys off), the request let in as that key — the one it
        sent, else its sign-in cookie's — under the key's limits. Raises
        ``tk.APIKeyRefused``: 401 without either (or the key is gone), 429 over its limits."""
        name = tk.api_key_name(request) or self._signed_in(request)
        return name if await tk.admit_key(request, name) and name is not None else ""

    async def identified(self, request: Request) -> str:
        """The route dependency of the page's routes that read or stop a reply it started:
        the caller's key name, as :meth:`admitted` finds it, without counting a request
        (the reply was counted when it started). 401 without a key or sign-in."""
        name = tk.api_key_name(request) or self._signed_in(request)
        if name is None:
            await tk.admit_key(request, None)  # keys on: 401; off: everyone is ""
            return ""
        return name

    def _signed_in(self, request: Request) -> str | None:
        """The key the request's sign-in cookie names, if it is valid and no browser said
        another site sent the request (``Sec-Fetch-Site``: a sibling subdomain's page, say,
        which ``SameSite`` lets through; a request without the header is a client's own)."""
        cookie = request.cookies.get(COOKIE)
        if cookie is None or request.headers.get("sec-fetch-site", "same-origin") != "same-origin":
            return None
        return self.sessions.owner_of(cookie)


def caller(connection: HTTPConnection) -> str:
    """The route dependency of the keyed routes (the OpenAI API, its WebSocket): the name
    of the key the front let the request in with ("" with keys off)."""
    return tk.api_key_name(connection) or ""
