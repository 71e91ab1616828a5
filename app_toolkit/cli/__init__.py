"""The ``app-toolkit`` command: run, build, deploy, config, status, shutdown, new, keys,
and the traffic policies (traffic, rollout, shadow)."""

from __future__ import annotations

import click

from app_toolkit.cli.deploy import build, deploy, show_config
from app_toolkit.cli.keys import keys
from app_toolkit.cli.manage import new, shutdown, status
from app_toolkit.cli.serve import run
from app_toolkit.cli.traffic import rollout, shadow, traffic

__all__ = ["main"]


@click.group()
@click.version_option(package_name="app_toolkit", prog_name="app-toolkit")
def main() -> None:
    """Serve FastAPI routers as a scalable service on Ray."""


for _command in (run, build, deploy, show_config, status, shutdown, new, keys, traffic, rollout, shadow):
    main.add_command(_command)
