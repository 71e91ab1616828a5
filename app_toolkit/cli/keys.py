"""``app-toolkit keys``: make an API key, and what to store for it."""

from __future__ import annotations

from datetime import datetime

import click

from app_toolkit.config.api_keys import APIKey, key_hash, new_key


@click.group()
def keys() -> None:
    """API keys for http_options.api_keys or its api_keys_file (docs/security.md)."""


@keys.command("new")
@click.argument("name")
@click.option(
    "--expires",
    type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S"]),
    default=None,
    help="When the key stops opening (UTC), e.g. 2027-01-31.",
)
def new(name: str, expires: datetime | None) -> None:
    """Print a fresh key for NAME once, and the entry to add to the keys file.

    The key is shown here only: the options and the file hold its SHA-256.
    """
    key = new_key()
    try:
        entry = APIKey(name=name, hash=key_hash(key), expires_at=expires)
    except ValueError:
        raise click.BadParameter(
            "use 1-64 letters, digits, '_', '.', '@' or '-'", param_hint="NAME"
        ) from None
    line = f"- {{name: '{entry.name}', hash: '{entry.hash}'"
    if entry.expires_at is not None:
        line += f", expires_at: '{entry.expires_at.isoformat()}'"
    click.echo(f"API key for {entry.name} (shown once; give it to its holder now):\n  {key}")
    click.echo(f"Add this entry to your api_keys_file (or http_options.api_keys):\n  {line}}}")
