"""``app-toolkit traffic``, ``rollout`` and ``shadow``: the traffic policies of a running
toolkit (docs/traffic.md)."""

from __future__ import annotations

import click

from app_toolkit.cli.session import act, fail
from app_toolkit.config import RolloutOptions, ShadowOptions, default_of, parse_options
from app_toolkit.exceptions import ConfigError


def _help(model: type[RolloutOptions | ShadowOptions], name: str) -> str:
    return model.model_fields[name].description or ""


@click.command()
@click.argument("app_name", metavar="APP")
@click.argument("weights", nargs=-1, required=True, metavar="NAME=WEIGHT...")
@click.option("--address", default="auto", show_default=True, help="Ray cluster to act on.")
def traffic(app_name: str, weights: tuple[str, ...], address: str) -> None:
    """Split APP's traffic between applications by weight, e.g.
    `app-toolkit traffic chat chat=90 chat-v2=10`; `chat=100` ends the split. APP/DEPLOYMENT
    splits the calls to one deployment between deployments of its application."""
    try:
        parsed = _parse_weights(weights)
    except ConfigError as exc:
        fail(exc)
        return
    session = act(address, lambda running: running.set_traffic(app_name, parsed))
    app, _, deployment = app_name.partition("/")
    info = session.status().applications[app]
    shares = info.deployments[deployment].traffic if deployment else info.traffic
    described = ", ".join(f"{name} {share:.1%}" for name, share in shares.items()) or f"all to {app_name}"
    click.echo(f"app-toolkit: traffic of {app_name}: {described}")


@click.command("rollout")
@click.argument("app_name", metavar="APP")
@click.option("--to", "canary", required=True, help="The application to move the traffic to.")
@click.option(
    "--steps",
    default=",".join(f"{step:g}" for step in default_of(RolloutOptions, "steps")),
    show_default=True,
    help=_help(RolloutOptions, "steps"),
)
@click.option(
    "--interval",
    "interval_s",
    type=float,
    default=default_of(RolloutOptions, "interval_s"),
    show_default=True,
    help=_help(RolloutOptions, "interval_s"),
)
@click.option(
    "--max-error-rate",
    type=float,
    default=default_of(RolloutOptions, "max_error_rate"),
    show_default=True,
    help=_help(RolloutOptions, "max_error_rate"),
)
@click.option(
    "--max-p99-ms",
    type=float,
    default=default_of(RolloutOptions, "max_p99_ms"),
    help=_help(RolloutOptions, "max_p99_ms"),
)
@click.option("--address", default="auto", show_default=True, help="Ray cluster to act on.")
def rollout(
    app_name: str,
    canary: str,
    steps: str,
    interval_s: float,
    max_error_rate: float,
    max_p99_ms: float | None,
    address: str,
) -> None:
    """Move APP's traffic to a canary step by step; back at once if the canary fails.
    `app-toolkit status` shows how it goes."""
    try:
        shares = tuple(float(step) for step in steps.split(","))
    except ValueError:
        fail(ConfigError(f"--steps takes percentages like 1,10,50,100; got {steps!r}"))
    given = {"steps": shares, "interval_s": interval_s, "max_error_rate": max_error_rate}
    try:
        options = parse_options(RolloutOptions, {**given, "max_p99_ms": max_p99_ms}, "rollout")
    except ConfigError as exc:
        fail(exc)
    act(address, lambda running: running.rollout(app_name, canary, options))
    click.echo(f"app-toolkit: rollout of {app_name} to {canary} started; see `app-toolkit status`")


@click.command("shadow")
@click.argument("app_name", metavar="APP")
@click.option("--to", "shadow_app", default=None, help="The application that gets the copies.")
@click.option(
    "--fraction",
    type=float,
    default=default_of(ShadowOptions, "fraction"),
    show_default=True,
    help=_help(ShadowOptions, "fraction"),
)
@click.option("--compare", default=default_of(ShadowOptions, "compare"), help=_help(ShadowOptions, "compare"))
@click.option("--off", is_flag=True, help="Stop copying APP's requests.")
@click.option("--address", default="auto", show_default=True, help="Ray cluster to act on.")
def shadow(
    app_name: str, shadow_app: str | None, fraction: float, compare: str, off: bool, address: str
) -> None:
    """Copy a share of APP's requests to another application and compare its answers
    (`app-toolkit status` shows how they compare)."""
    if not off and shadow_app is None:
        fail(ConfigError("Give --to APPLICATION (or --off to stop)"))
        return
    act(address, lambda running: running.shadow(app_name, None if off else shadow_app, fraction, compare))
    click.echo(f"app-toolkit: shadow of {app_name} {'stopped' if off else f'to {shadow_app} set'}")


def _parse_weights(pairs: tuple[str, ...]) -> dict[str, float]:
    weights: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = float("nan")
        if not sep or not name or weight != weight:
            raise ConfigError(f"{pair!r} is not NAME=WEIGHT (e.g. chat-v2=10)")
        weights[name] = weight
    return weights
