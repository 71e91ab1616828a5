"""API keys as the options hold them: a name, the key's SHA-256 and an optional expiry.

A key itself is never stored: ``http_options.api_keys`` and the keys file hold only
``sha256:<hex>`` of each, so a settings file or an environment dump gives no usable key.
:func:`new_key` makes a key (256 random bits) and :func:`key_hash` what to store for it
(``app-toolkit keys new NAME`` prints both, the key once). The keys file
(``http_options.api_keys_file``) holds the same entries as YAML, and the proxies read it
again when it changes: keys are added, revoked and given an expiry without a restart.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import yaml
from pydantic import Field, TypeAdapter, ValidationError, field_validator

from app_toolkit.config.schema import Strict, explain
from app_toolkit.exceptions import ConfigError

#: What a key made here starts with: its kind, readable in a log a user pastes by mistake.
KEY_PREFIX = "atk_"
_HASH_PREFIX = "sha256:"
_EMPTY_KEY_HASH = _HASH_PREFIX + hashlib.sha256(b"").hexdigest()


class APIKey(Strict):
    """One API key: who holds it (a name, a metric label) and the SHA-256 of the key."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_.@-]{1,64}$",
        description="Who holds the key: letters, digits, '_', '.', '@' or '-' (it labels metrics).",
    )
    hash: str = Field(
        pattern=r"^sha256:[0-9a-f]{64}$",
        description="sha256:<64 hex digits> of the key (app-toolkit keys new NAME prints it).",
    )
    expires_at: datetime | None = Field(
        None, description="When the key stops opening (ISO 8601; no zone: UTC). Unset: never."
    )
    requests_per_window: int | None = Field(
        None,
        ge=1,
        description="Requests (and WebSockets) the key may send per window, all proxies and "
        "ingress replicas together; more get 429 with Retry-After. Unset: no limit.",
    )
    max_concurrent_requests: int | None = Field(
        None,
        ge=1,
        description="Requests (and WebSockets) of the key in progress at once, cluster-wide; "
        "more get 429. Unset: no limit.",
    )
    tokens_per_window: int | None = Field(
        None,
        ge=1,
        description="Tokens (prompt and completion) the key's LLM replies may use per window, "
        "cluster-wide, as charged where replies end (app_toolkit.llm, or charge_tokens); once "
        "a window's are used, requests get 429. Unset: no limit.",
    )
    window_s: float = Field(
        60.0, ge=1, le=86400, description="Length of the key's limit windows in seconds (a minute)."
    )
    weight: float = Field(
        1.0,
        ge=0.001,
        le=1000,
        description="The key's share of a saturated deployment against other keys': its "
        "waiting requests are served in proportion to their keys' weights (equal by default).",
    )
    priority: int = Field(
        0,
        ge=-1000,
        le=1000,
        description="The key's priority class: a saturated deployment serves the waiting "
        "requests of a lower class first (vLLM's order); also vLLM's request priority. 0 by default.",
    )

    client_cert: str | None = Field(
        None,
        description="sha256:<64 hex digits> of a client certificate (its DER bytes; what openssl "
        "x509 -noout -fingerprint -sha256 prints is taken as it is) whose "
        "connections are this key's when a request sends no key (HTTPS with ssl_ca_certs and "
        "ssl_cert_reqs). Unset: only the key itself names it.",
    )

    @field_validator("client_cert", mode="before")
    @classmethod
    def _fingerprint(cls, value: object) -> object:
        """``sha256:<hex>`` of a fingerprint given with colons or upper-case digits."""
        if not isinstance(value, str):
            return value
        printed = value.rpartition("=")[2]  # openssl prints "sha256 Fingerprint=AB:CD:..."
        digits = printed.strip().lower().removeprefix(_HASH_PREFIX).replace(":", "")
        if len(digits) != 64 or any(digit not in "0123456789abcdef" for digit in digits):
            raise ValueError("client_cert must be sha256:<64 hex digits> (the certificate's SHA-256)")
        return _HASH_PREFIX + digits

    @field_validator("hash")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if value == _EMPTY_KEY_HASH:  # an empty header would present it
            raise ValueError("hash is the SHA-256 of an empty key: make a key with app-toolkit keys new NAME")
        return value

    @field_validator("expires_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value

    @property
    def digest(self) -> bytes:
        """The key's SHA-256, as :func:`digest_of` gives it for a presented key."""
        return self.digest_of_hash(self.hash)

    @staticmethod
    def digest_of_hash(stored: str) -> bytes:
        """The SHA-256 a stored ``sha256:<hex>`` names."""
        return bytes.fromhex(stored.removeprefix(_HASH_PREFIX))

    @property
    def limited(self) -> bool:
        """The key has a limit the fronts keep."""
        return any(
            limit is not None
            for limit in (self.requests_per_window, self.max_concurrent_requests, self.tokens_per_window)
        )

    @property
    def expires_s(self) -> float | None:
        """The expiry as a Unix time (None: never)."""
        return self.expires_at.timestamp() if self.expires_at is not None else None


_KEY_LIST = TypeAdapter(tuple[APIKey, ...])


def new_key() -> str:
    """A fresh API key: 256 random bits, URL-safe, with :data:`KEY_PREFIX` before them."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest_of(key: bytes) -> bytes:
    """The SHA-256 of a presented key (what keys are looked up by)."""
    return hashlib.sha256(key).digest()


#: The message of every 401 for a missing, malformed, unknown or expired key: one for all,
#: so a caller learns nothing of which keys exist.
UNAUTHORIZED_MESSAGE = (
    "Missing or invalid API key: send it as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'."
)
_BEARER = b"bearer "


def check_key(key: str, what: str) -> None:
    """ValueError (never repeating the key) unless ``key`` can be sent as a Bearer token:
    not empty, no spaces or tabs at either end."""
    if not key.strip():
        raise ValueError(f"{what} may not be empty")
    if key != key.strip(" \t"):
        raise ValueError(f"{what} may not start or end with spaces (a Bearer token cannot carry them)")


def presented_key(authorization: bytes | None, api_key: bytes | None) -> tuple[bytes, bool]:
    """The key a request presents in its ``Authorization`` and ``X-API-Key`` values (``b""``
    for one sent twice), and whether it is well formed: ``Bearer <key>``, else the
    ``X-API-Key``. What comes back is hashed and looked up whatever it is (a missing key
    is ``b""``), so the check does the same work for every request."""
    if authorization is not None:
        well_formed = authorization[:7].lower() == _BEARER
        return (authorization[7:].strip(b" \t") if well_formed else authorization), well_formed
    return (api_key if api_key is not None else b""), api_key is not None


#: The headers a key is presented in (names as ASGI gives them: lower-case).
AUTHORIZATION_HEADER = b"authorization"
API_KEY_HEADER = b"x-api-key"


def key_headers(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bytes | None, bytes | None]:
    """The ``Authorization`` and ``X-API-Key`` values among ``headers`` (lower-case names),
    for :func:`presented_key`: None where one is not sent, ``b""`` where one is sent twice
    (which opens nothing)."""
    authorization = api_key = None
    for name, value in headers:
        if name == AUTHORIZATION_HEADER:
            authorization = value if authorization is None else b""
        elif name == API_KEY_HEADER:
            api_key = value if api_key is None else b""
    return authorization, api_key


def key_hash(key: str) -> str:
    """What the options store for ``key``: ``sha256:<hex>``."""
    return _HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def check_unique(keys: tuple[APIKey, ...]) -> None:
    """Two entries with one name, hash or client certificate would make a key's name
    ambiguous."""
    for what in ("name", "hash", "client_cert"):
        seen: set[str] = set()
        for key in keys:
            value = getattr(key, what)
            if value is None:
                continue
            if value in seen:
                shown = value if what != "hash" else f"of the key named {key.name!r}"
                raise ValueError(f"two API keys have the same {what} ({shown}); each key needs its own")
            seen.add(value)


def read_keys_file(path: str) -> tuple[APIKey, ...]:
    """The keys in the YAML file at ``path``: a list of ``{name, hash, expires_at, limits,
    weight, priority}``, or
    a mapping with that list under ``keys``. ConfigError naming the file if it cannot be
    read or is not such a list."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"Cannot read the API keys file {path!r}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:  # where, not what: the line may hold a key pasted by mistake
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"The API keys file {path!r} is not valid YAML{where}") from None
    if isinstance(data, dict) and set(data) == {"keys"}:
        data = data["keys"]
    if data is None:
        return ()
    try:
        keys = _KEY_LIST.validate_python(data)
        check_unique(keys)
    except ValidationError as exc:
        raise ConfigError(
            explain(
                exc,
                f"API keys file {path!r} (a list of name, hash and optional expires_at and limits)",
            )
        ) from None
    except ValueError as exc:
        raise ConfigError(f"The API keys file {path!r}: {exc}") from None
    return keys
