"""How the two ends of a channel connection prove to each other that they hold the
replica's token, without sending it.

The controller gives each replica a fresh random token and publishes it to callers over
Ray (inside the trust boundary, docs/security.md). A connection opens with three frames:

1. caller -> HELLO: a fresh caller nonce;
2. replica -> CHALLENGE: a fresh replica nonce, then ``HMAC(token, "replica" | nonces)``;
3. caller -> PROOF: ``HMAC(token, "caller" | nonces)``.

The caller sends nothing else until the replica's proof checks out, so a process that took
over a dead replica's port learns nothing; the replica serves nothing until the caller's
proof checks out, and its nonce is new on every connection, so a recorded handshake is
worth nothing. The role labels keep one side's proof from serving as the other's.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

#: Either side closes a connection whose peer has not finished its part this soon.
HANDSHAKE_TIMEOUT_S = 10.0
NONCE_BYTES = 16
PROOF_BYTES = hashlib.sha256().digest_size
#: The largest frame either side accepts before the other has proven itself.
MAX_HANDSHAKE_FRAME = 256

_REPLICA = b"app_toolkit replica"
_CALLER = b"app_toolkit caller"


def nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def replica_proof(token: bytes, caller_nonce: bytes, replica_nonce: bytes) -> bytes:
    return _mac(token, _REPLICA, caller_nonce, replica_nonce)


def caller_proof(token: bytes, caller_nonce: bytes, replica_nonce: bytes) -> bytes:
    return _mac(token, _CALLER, caller_nonce, replica_nonce)


def matches(expected: bytes, given: bytes | memoryview) -> bool:
    """Constant-time comparison of a proof."""
    return hmac.compare_digest(expected, bytes(given))


def _mac(token: bytes, role: bytes, caller_nonce: bytes, replica_nonce: bytes) -> bytes:
    return hmac.new(token, b"|".join((role, caller_nonce, replica_nonce)), hashlib.sha256).digest()
