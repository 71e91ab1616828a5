"""Who is calling: API keys (``Authorization: Bearer``), the page's sign-in cookie, and the
route dependencies that turn them away (401) or over their limits (429).

With ``CHAT_API_KEYS`` empty (local use) every caller is let in as ``""`` and nothing is
counted per caller. Keys are checked against their SHA-256 with a constant-time
comparison against every configured hash, so the time a check takes says nothing about
which key (or how much of one) matched. The page never holds a key: it posts one once
to ``/api/session`` and gets a signed cookie (``HttpOnly``, ``SameSite=Strict``) that
names the key's owner until it expires. A page reply's id is bound to the caller that
started it (``ReplyIds``): another caller's id for it is a reply that does not exist.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import uuid
from collections.abc import Awaitable, Callable

import app_toolkit as tk
from app_toolkit.llm import ANSWERED, OpenAIError, as_openai_error
from fastapi import Request, WebSocket, WebSocketException, status

from .keys import check_entries, key_hash
from .settings import Settings

COOKIE = "chat_session"


def unauthorized(why: str) -> OpenAIError:
    return OpenAIError(401, why, "invalid_request_error", "invalid_api_key")


class KeyRing:
    """The configured keys, kept as their hashes."""

    def __init__(self, entries: list[str]) -> None:
        self._owners = list(check_entries(entries).items())  # (hash, owner)

    def owner_of(self, key: str) -> str | None:
        """The owner of ``key``, or None."""
        digest = key_hash(key).encode()
        found: str | None = None
        for known, owner in self._owners:  # every hash is compared: no early exit
            if hmac.compare_digest(digest, known.encode()):
                found = owner
        return found

    @property
    def owners(self) -> list[str]:
        return sorted({owner for _, owner in self._owners})


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
    """Finds the caller of a request: its bearer key, else its sign-in cookie."""

    def __init__(self, settings: Settings, secret: bytes) -> None:
        self.keys_on = settings.keys_on
        self.keys = KeyRing(settings.api_keys)
        self.sessions = Sessions(secret, settings.session_ttl_s)
        self.replies = ReplyIds(secret)

    def caller(self, authorization: str | None, cookie: str | None) -> str:
        """The caller's owner name ("" with keys off); raises a 401 :class:`OpenAIError`."""
        if not self.keys_on:
            return ""
        if authorization:
            scheme, _, key = authorization.partition(" ")
            owner = self.keys.owner_of(key.strip()) if scheme.lower() == "bearer" else None
            if owner is None:
                raise unauthorized("Incorrect API key provided.")
            return owner
        owner = self.sessions.owner_of(cookie) if cookie else None
        if owner is None:
            raise unauthorized(
                "You didn't provide an API key: send it as 'Authorization: Bearer KEY', "
                "or sign in on the page."
            )
        return owner


class Guard:
    """Route dependencies: ``admitted`` (the caller; 401 without a valid key or sign-in,
    429 over its requests or tokens per minute) and ``usage`` (the caller's counts).
    ``accounts`` is None with keys off: then everyone is let in and nothing is counted."""

    def __init__(self, access: Access, accounts: tk.Application | None) -> None:
        self.access = access
        self.admitted = self._admitted(accounts)
        self.usage = self._usage(accounts)
        self.socket_admitter = self._socket_admitter(accounts)

    def caller(self, request: Request) -> str:
        return self.access.caller(request.headers.get("authorization"), request.cookies.get(COOKIE))

    def socket_caller(self, socket: WebSocket) -> str:
        return self.access.caller(socket.headers.get("authorization"), socket.cookies.get(COOKIE))

    def _admitted(self, accounts_app: tk.Application | None) -> Callable[..., Awaitable[str]]:
        if accounts_app is None:

            async def everyone(request: Request) -> str:
                return ""

            return everyone

        async def admitted(request: Request, accounts: tk.DeploymentHandle = tk.Depends(accounts_app)) -> str:
            owner = self.caller(request)
            await admit(accounts, owner)
            return owner

        return admitted

    def _usage(self, accounts_app: tk.Application | None) -> Callable[..., Awaitable[dict[str, object]]]:
        if accounts_app is None:

            async def uncounted(request: Request) -> dict[str, object]:
                raise OpenAIError(
                    404, "Usage is counted per API key; this server asks for none.", "invalid_request_error"
                )

            return uncounted

        async def usage(
            request: Request, accounts: tk.DeploymentHandle = tk.Depends(accounts_app)
        ) -> dict[str, object]:
            counted: dict[str, object] = await accounts.usage.remote(self.caller(request))
            return counted

        return usage

    def _socket_admitter(self, accounts_app: tk.Application | None) -> Callable[..., Awaitable[SocketAdmit]]:
        """For a WebSocket: closes it (1008) at once without a valid key or sign-in, else
        gives the route what admits each of its messages (as a request, under the limits)."""
        if accounts_app is None:

            async def free(socket: WebSocket) -> SocketAdmit:
                return _everyone

            return free

        async def gate(
            socket: WebSocket, accounts: tk.DeploymentHandle = tk.Depends(accounts_app)
        ) -> SocketAdmit:
            try:
                owner = self.socket_caller(socket)
            except OpenAIError as refused:
                raise WebSocketException(status.WS_1008_POLICY_VIOLATION, refused.message) from None

            async def admit_one() -> str:
                await admit(accounts, owner)
                return owner

            return admit_one

        return gate


#: Admits one more message of a WebSocket's caller; returns the caller (raises OpenAIError 429).
SocketAdmit = Callable[[], Awaitable[str]]


async def _everyone() -> str:
    return ""


async def admit(accounts: tk.DeploymentHandle, owner: str) -> None:
    """Let ``owner`` make one more request, or raise the 429 (or 503) :class:`OpenAIError`."""
    try:
        await accounts.admit.remote(owner)
    except ANSWERED as exc:
        raise as_openai_error(exc) from None
