"""``app-toolkit build``, ``deploy`` and ``config``: config files, and applying one to a
running cluster."""

from __future__ import annotations

import os
import sys

import click

from app_toolkit import api
from app_toolkit import build as building
from app_toolkit._runtime.backends.base import session_factory
from app_toolkit._runtime.session import Session
from app_toolkit.cli.session import fail, find, no_cluster
from app_toolkit.config.file import ServeConfigFile, dump_config, load_config
from app_toolkit.config.http import checked
from app_toolkit.exceptions import AppToolkitError, ConfigError, DeployError


def apply(
    session: Session,
    config: ServeConfigFile,
    source: str,
    wait_s: float | None,
    wait: bool = True,
    reload: bool = False,
) -> None:
    """Build the file's apps where replicas run, apply them, wait until each runs.

    ``reload`` (``--reload`` saw a source change): the deployments whose source files
    changed are replaced (their code version says so, as for any deploy), and the streams
    of the replicas replaced end as their drain starts.
    """
    try:
        specs = session.build(building.builds(config.applications))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if reload:
        specs = [building.reloaded(spec) for spec in specs]
    session.apply_config(specs, config.as_written())
    current = session.status().applications
    for app in config.applications:
        if app.traffic or current[app.name].traffic:  # the file's split, or none
            session.set_traffic(app.name, app.traffic or {app.name: 1})
        if app.shadow is not None:
            session.shadow(app.name, app.shadow.to, app.shadow.fraction, app.shadow.compare)
        elif current[app.name].shadow is not None:
            session.shadow(app.name, None, 0)
    for app in config.applications if wait else ():
        api.wait_for_application(session, app.name, timeout_s=wait_s)


@click.command()
@click.argument("import_paths", nargs=-1, required=True, metavar="IMPORT_PATH...")
@click.option("-o", "--output", "output", default=None, help="Write the config here (default: print it).")
def build(import_paths: tuple[str, ...], output: str | None) -> None:
    """Write a config file for the apps at IMPORT_PATH... (module:attribute or module.attribute).

    Each deployment gets the options its code sets; edit the file, then apply it with
    `app-toolkit deploy FILE` (or run it with `app-toolkit run FILE`).
    """
    sys.path.insert(0, os.getcwd())
    try:
        text = dump_config(building.describe(import_paths))
    except AppToolkitError as exc:
        fail(exc)
        return
    if output is None:
        click.echo(text, nl=False)
        return
    with open(output, "w") as file:
        file.write(text)
    click.echo(f"app-toolkit: wrote {output}", err=True)


@click.command()
@click.argument("config_file", metavar="CONFIG.yaml")
@click.option("--address", default="auto", show_default=True, help="Ray cluster to deploy to.")
@click.option("--wait", is_flag=True, help="Return once every app runs; exit 1 if one fails.")
@click.option(
    "--timeout", "timeout_s", default=600.0, show_default=True, help="Seconds --wait waits for the apps."
)
def deploy(config_file: str, address: str, wait: bool, timeout_s: float) -> None:
    """Apply CONFIG.yaml to a running cluster: its apps are created or updated, others removed.

    The toolkit keeps running after this command exits (start the cluster with
    `ray start --head`; stop the toolkit with `app-toolkit shutdown`).
    """
    try:
        config = load_config(config_file)
        session = _join(address, config)
        apply(session, config, config_file, wait_s=timeout_s if wait else None, wait=wait)
    except (AppToolkitError, DeployError) as exc:
        fail(exc)
        return
    names = ", ".join(app.name for app in config.applications)
    state = "running" if wait else "deploying (see `app-toolkit status`)"
    click.echo(f"app-toolkit: applied {config_file}: {names} {state}")


def _join(address: str, config: ServeConfigFile) -> Session:
    factory = session_factory("ray")
    try:
        return factory.start(address, checked(config.http()))
    except ConnectionError as exc:
        raise no_cluster(address, exc) from None


@click.command(name="config")
@click.option("--address", default="auto", show_default=True, help="Ray cluster to inspect.")
def show_config(address: str) -> None:
    """Print the config file last deployed (apps changed since by hand are left out)."""
    session = find(address)
    written = session.config_file() if session is not None else None
    if written is None:
        click.echo("app-toolkit: no config file is deployed on this cluster", err=True)
        return
    click.echo(dump_config(written), nl=False)
