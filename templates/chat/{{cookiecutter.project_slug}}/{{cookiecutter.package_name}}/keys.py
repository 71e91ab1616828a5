"""API keys: made here, kept in settings only as their hashes.

``python -m chat.keys OWNER`` (the app's package, ``chat`` here) prints a new key (give
it to OWNER; it is shown once) and the entry to add to ``CHAT_API_KEYS``:
``OWNER:SHA256`` of the key. A key is 32 random
bytes, so a plain SHA-256 is enough to keep it (no password hashing needed): whoever
reads the settings cannot use the keys they list.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import sys

PREFIX = "sk-chat-"
MAKER = f"python -m {__package__}.keys OWNER"  # how to make a key, for messages
_ENTRY = re.compile(r"([A-Za-z0-9_.@-]{1,64}):([0-9a-f]{64})")


def new_key() -> str:
    """A fresh API key."""
    return PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    """What settings keep of ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()


def check_entries(entries: list[str]) -> dict[str, str]:
    """Hash → owner for ``CHAT_API_KEYS`` entries; raises ``ValueError`` naming a bad one."""
    owners: dict[str, str] = {}
    for entry in entries:
        matched = _ENTRY.fullmatch(entry.strip())
        if matched is None:
            shown = entry if len(entry) < 20 else entry[:12] + "…"
            raise ValueError(
                f"CHAT_API_KEYS entry {shown!r} is not OWNER:SHA256 (64 hex digits); make one with: {MAKER}"
            )
        owner, digest = matched.groups()
        if digest in owners:
            raise ValueError(f"CHAT_API_KEYS lists the same key twice (for {owners[digest]!r} and {owner!r})")
        owners[digest] = owner
    return owners


def main(argv: list[str]) -> int:
    if len(argv) != 1 or _ENTRY.fullmatch(f"{argv[0]}:{'0' * 64}") is None:
        print(f"usage: {MAKER}   (OWNER: letters, digits, _ . @ -)", file=sys.stderr)
        return 2
    key = new_key()
    print(f"key (give it to {argv[0]}; it is not kept anywhere): {key}")
    print(f"add to CHAT_API_KEYS: {argv[0]}:{key_hash(key)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
