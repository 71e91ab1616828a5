"""``app-toolkit status``, ``shutdown`` and ``new``."""

from __future__ import annotations

import json

import click

from app_toolkit.cli.session import fail, find, key_values
from app_toolkit.exceptions import AppToolkitError, ConfigError


@click.command()
@click.option("--address", default="auto", show_default=True, help="Ray cluster to inspect.")
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON (for tools).")
def status(address: str, as_json: bool) -> None:
    """Print applications, deployments, replicas and proxies."""
    session = find(address)
    if session is None:
        fail(ConfigError("app_toolkit is not running on this cluster"))
    current = session.status()
    click.echo(json.dumps(current.to_dict(), indent=2) if as_json else current.to_text())


@click.command()
@click.option("--address", default="auto", show_default=True, help="Ray cluster to act on.")
def shutdown(address: str) -> None:
    """Stop every application, the proxy and the controller."""
    session = find(address)
    if session is None:
        click.echo("app_toolkit is not running; nothing to stop")
        return
    session.shutdown()
    click.echo("app_toolkit stopped")


@click.command()
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
    from app_toolkit.cli import scaffold

    if list_only or template is None:
        for name, description in scaffold.list_templates().items():
            click.echo(f"{name:10} {description}")
        if template is None and not list_only:
            click.echo("\nUsage: app-toolkit new TEMPLATE [-o DIR] [--no-input] [KEY=VALUE]...")
        return
    try:
        context = key_values(values, 'project_name="Hello World"')
        project = scaffold.bake(template, output_dir, context=context, no_input=no_input, force=force)
    except AppToolkitError as exc:
        fail(exc)
        return
    click.echo(f"app-toolkit: created {project}")
    click.echo(f"Next: cd {project} && make test && make run   (PORT=8001 make run: another port)")
    if template == "chat":
        click.echo("      make run installs the local model (CPU torch, ~1 GB) the first time;")
        click.echo("      CHAT_BACKEND=echo make run serves at once, with a model that repeats you")
