"""The ``app-toolkit`` command: run, status, shutdown, new."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar, get_args, get_origin

import click

from app_toolkit import api
from app_toolkit._runtime.backends.base import session_factory
from app_toolkit.config import HTTPOptions, parse_http_options
from app_toolkit.deployment import Application, Deployment
from app_toolkit.exceptions import AppToolkitError, ConfigError
from app_toolkit.import_path import import_attr

F = TypeVar("F", bound=Callable[..., Any])


def _as_application(value: Any, path: str, name: str | None) -> Application:
    from fastapi import APIRouter, FastAPI

    from app_toolkit.ingress import App

    if isinstance(value, Application):
        return value
    if isinstance(value, (FastAPI, APIRouter)):
        return App(value, name=name or "default")
    if isinstance(value, Deployment):
        raise ConfigError(
            f'"{path}" is a deployment; point at an application such as '
            f"{value.name}.bind() (assign it to a variable and use that)"
        )
    raise ConfigError(
        f'"{path}" is a {type(value).__name__}; expected an application '
        "(App(router) or Deployment.bind()), a FastAPI app or an APIRouter"
    )


def _fail(exc: Exception) -> None:
    click.echo(f"Error: {exc}", err=True)
    sys.exit(1)


@click.group()
def main() -> None:
    """Serve FastAPI routers as a scalable service on Ray."""


def _http_option(name: str) -> Callable[[F], F]:
    """A ``run`` flag for one HTTP option: default, help and choices come from its field."""
    field = HTTPOptions.model_fields[name]
    flag = f"--{name.replace('_', '-')}"
    kwargs: dict[str, Any] = {"default": field.default, "show_default": True, "help": field.description}
    choices = get_args(field.annotation) if get_origin(field.annotation) is Literal else ()
    if choices:
        kwargs["type"] = click.Choice(list(choices))
    elif field.annotation is bool:
        flag = f"{flag}/--no-{flag[2:]}"
    else:
        kwargs["type"] = field.annotation
    return click.option(flag, name, **kwargs)


@main.command()
@click.argument("import_path")
@_http_option("host")
@_http_option("port")
@click.option("--address", default=None, help='Ray cluster to join ("auto"); default: start a local one.')
@click.option("--local", "local", is_flag=True, help="Run everything in this process (no Ray).")
@click.option("--name", default=None, help="Application name (default: the app's own, or 'default').")
@click.option("--route-prefix", default=None, help="URL prefix of the app (default: the app's own, or '/').")
@_http_option("access_log")
@_http_option("proxy_location")
def run(
    import_path: str,
    host: str,
    port: int,
    address: str | None,
    local: bool,
    name: str | None,
    route_prefix: str | None,
    access_log: bool,
    proxy_location: str,
) -> None:
    """Deploy IMPORT_PATH (module:attribute) and serve it until Ctrl-C."""
    try:
        http = parse_http_options(
            {"host": host, "port": port, "access_log": access_log, "proxy_location": proxy_location}
        )
        cwd = os.getcwd()
        # Ray worker processes import the user's module too: let them find it here.
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH")) if p)
        target = _as_application(import_attr(import_path), import_path, name)
        session = api.start(http_options=http, backend="local" if local else "auto", address=address)
        kwargs: dict[str, Any] = {"name": name}
        if route_prefix is not None:
            kwargs["route_prefix"] = route_prefix
        api.run(target, **kwargs)
        url = next(iter(session.status().proxies.values()), f"http://{host}:{port}")
        app_name = name or target.default_name or "default"
        prefix = session.status().applications[app_name].route_prefix or "/"
    except AppToolkitError as exc:
        _fail(exc)
        return
    click.echo(
        f"app-toolkit: serving {import_path} at {url.rstrip('/')}{prefix if prefix != '/' else '/'}"
        " (Ctrl-C to stop)"
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    click.echo("app-toolkit: shutting down")
    api.shutdown()


@main.command()
@click.option("--address", default="auto", show_default=True, help="Ray cluster to inspect.")
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON (for tools).")
def status(address: str, as_json: bool) -> None:
    """Print applications, deployments, replicas and proxies."""
    try:
        session = session_factory("ray").find(address)
    except Exception as exc:  # noqa: BLE001 - ray.init failing to find a cluster
        _fail(ConfigError(f"No Ray cluster at {address!r}: {exc}"))
        return
    if session is None:
        _fail(ConfigError("app_toolkit is not running on this cluster"))
        return
    current = session.status()
    click.echo(json.dumps(current.to_dict(), indent=2) if as_json else current.to_text())


@main.command()
@click.option("--address", default="auto", show_default=True, help="Ray cluster to act on.")
def shutdown(address: str) -> None:
    """Stop every application, the proxy and the controller."""
    try:
        session = session_factory("ray").find(address)
    except Exception as exc:  # noqa: BLE001 - ray.init failing to find a cluster
        _fail(ConfigError(f"No Ray cluster at {address!r}: {exc}"))
        return
    if session is None:
        click.echo("app_toolkit is not running; nothing to stop")
        return
    session.shutdown()
    click.echo("app_toolkit stopped")


@main.command()
@click.argument("template", required=False)
@click.argument("values", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("-o", "--output-dir", default=".", show_default=True, help="Where to create the project.")
@click.option("--no-input", is_flag=True, help="Ask nothing: use the defaults and the KEY=VALUE given.")
@click.option("--force", is_flag=True, help="Overwrite an existing project folder.")
@click.option("--list", "list_only", is_flag=True, help="List the templates and exit.")
def new(
    template: str | None,
    values: tuple[str, ...],
    output_dir: str,
    no_input: bool,
    force: bool,
    list_only: bool,
) -> None:
    """Create a project from TEMPLATE (service or chat), e.g. `app-toolkit new chat -o ~/src`.

    KEY=VALUE pairs set the template's variables (project_name="My Bot", include_docker=no).
    """
    from app_toolkit import scaffold

    if list_only or template is None:
        for name, description in scaffold.list_templates().items():
            click.echo(f"{name:10} {description}")
        if template is None and not list_only:
            click.echo("\nUsage: app-toolkit new TEMPLATE [-o DIR] [--no-input] [KEY=VALUE]...")
        return
    try:
        project = scaffold.bake(
            template, output_dir, context=scaffold.parse_context(values), no_input=no_input, force=force
        )
    except AppToolkitError as exc:
        _fail(exc)
        return
    click.echo(f"app-toolkit: created {project}")
    click.echo(f"Next: cd {project} && make test && make run")


if __name__ == "__main__":
    main()
