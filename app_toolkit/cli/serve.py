"""``app-toolkit run``: serve an app or a config file's apps in the foreground."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Collection
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import click

from app_toolkit import api
from app_toolkit._runtime import log_format
from app_toolkit._runtime.backends.base import session_factory
from app_toolkit._runtime.session import Session
from app_toolkit.app_builder import load_application
from app_toolkit.cli.deploy import apply
from app_toolkit.cli.session import fail, key_values, no_cluster
from app_toolkit.cli.stop_signals import StopSignals
from app_toolkit.code_sources import dependents, is_user_source
from app_toolkit.config import LOG_LEVEL_ENV, HTTPOptions, parse_http_options
from app_toolkit.config.file import load_config
from app_toolkit.deployment import Application
from app_toolkit.exceptions import AppToolkitError, BuilderArgsError, ConfigError
from app_toolkit.status import ServeStatus

F = TypeVar("F", bound=Callable[..., Any])


def _http_option(name: str) -> Callable[[F], F]:
    """A ``run`` flag for one HTTP option: default, help and choices come from its field."""
    field = HTTPOptions.model_fields[name]
    flag = f"--{name.replace('_', '-')}"
    kwargs: dict[str, Any] = {"default": field.default, "show_default": True, "help": field.description}
    annotation = field.annotation
    if get_origin(annotation) in (Union, UnionType):  # X | None: an X, or not given
        annotation = next(part for part in get_args(annotation) if part is not type(None))
    choices = get_args(annotation) if get_origin(annotation) is Literal else ()
    if choices:
        kwargs["type"] = click.Choice(list(choices))
    elif annotation is bool:
        flag = f"{flag}/--no-{flag[2:]}"
    else:
        kwargs["type"] = annotation
    return click.option(flag, name, **kwargs)


def _env_option(name: str) -> Callable[[F], F]:
    """A ``run`` flag for an HTTP option that may also come from ``APP_TOOLKIT_<NAME>``
    (a secret, or a path to one, kept out of the command line)."""
    return click.option(
        f"--{name.replace('_', '-')}",
        name,
        default=None,
        envvar=f"APP_TOOLKIT_{name.upper()}",
        show_envvar=True,
        help=HTTPOptions.model_fields[name].description,
    )


_LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def _builder_args(ctx: click.Context, param: click.Parameter, pairs: tuple[str, ...]) -> dict[str, str]:
    """The ``KEY=VALUE`` arguments, checked as the command line is read (status 2 if bad)."""
    try:
        return key_values(pairs, "backend=echo")
    except ConfigError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


@click.command()
@click.argument("target", metavar="IMPORT_PATH|CONFIG.yaml")
@click.argument("args", nargs=-1, metavar="[KEY=VALUE]...", callback=_builder_args)
@_http_option("host")
@_http_option("port")
@click.option("--address", default=None, help='Ray cluster to join ("auto"); default: start a local one.')
@click.option("--local", "local", is_flag=True, help="Run everything in this process (no Ray).")
@click.option("--name", default=None, help="Application name (default: the app's own, or 'default').")
@click.option("--route-prefix", default=None, help="URL prefix of the app (default: the app's own, or '/').")
@click.option(
    "--reload", is_flag=True, help="Redeploy when a .py file under the current folder changes (development)."
)
@click.option(
    "--log-level",
    type=click.Choice(_LOG_LEVELS),
    default="info",
    show_default=True,
    help="Level of the toolkit's loggers, in this process and the replicas it starts.",
)
@click.option(
    "--log-format",
    type=click.Choice(log_format.FORMATS),
    default="text",
    show_default=True,
    help="Log lines as text (with timestamps) or JSON, in this process and every toolkit process.",
)
@_http_option("access_log")
@_http_option("proxy_location")
@_http_option("root_path")
@_http_option("proxy_headers")
@_http_option("forwarded_allow_ips")
@_http_option("metrics_allow_ips")
@_http_option("dashboard_allow_ips")
@_env_option("dashboard_token")
@_env_option("api_keys_file")
@_http_option("ssl_certfile")
@_http_option("ssl_keyfile")
@_env_option("ssl_keyfile_password")
@_http_option("ssl_ca_certs")
@_http_option("ssl_cert_reqs")
@click.pass_context
def run(
    ctx: click.Context,
    /,
    target: str,
    args: dict[str, str],
    address: str | None,
    local: bool,
    name: str | None,
    route_prefix: str | None,
    reload: bool,
    log_level: str,
    log_format: str,
    **http_flags: Any,
) -> None:
    """Serve an app (module:attribute or module.attribute) or a config file's apps until Ctrl-C or SIGTERM.

    KEY=VALUE arguments go to a builder function the import path names, as a config
    file's args do. With a config file, its http_options apply; flags given on the command
    line win.
    """
    signals = StopSignals()  # first: from here on one SIGINT or SIGTERM stops the command
    session: Session | None = None
    serving = False
    try:
        try:
            http, app = _prepare(ctx, target, args, name, route_prefix, log_level, log_format, http_flags)
            # Read: the processes this one starts (Ray's workers) do not inherit it.
            os.environ.pop("APP_TOOLKIT_SSL_KEYFILE_PASSWORD", None)
            session = signals.deferred(lambda: _start(http, local, address))
            names = _deploy(session, target, args, name, route_prefix, reload, app=app)
            _announce(target, names, session.status(), http)
        except AppToolkitError as exc:
            fail(exc)
        serving = True
        if reload:
            _redeploy_on_change(
                lambda changed: _deploy(session, target, args, name, route_prefix, True, changed=changed)
            )
        while True:
            time.sleep(60)  # until a stop signal interrupts it
    except KeyboardInterrupt:
        received = f"{signals.received.name} received" if signals.received is not None else "interrupted"
        click.echo(f"app-toolkit: {received}{'' if serving else ' while starting'}; shutting down")
    try:
        if session is not None and not signals.repeated:  # None: stopped before it started
            api.shutdown()
    except KeyboardInterrupt:
        pass  # a second signal
    if signals.repeated:
        click.echo("app-toolkit: a second signal: stopped before the shutdown finished", err=True)
        sys.exit(1)
    click.echo("app-toolkit: stopped")


#: Ray's driver installs abseil's crash handler in this process as it connects, and it
#: takes SIGTERM too: it prints a stack trace, and aborts the process 3 s later, cutting
#: the shutdown short. Ray reads this setting when it is imported.
_NO_CRASH_HANDLER_ENV = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"


def _start(http: HTTPOptions, local: bool, address: str | None) -> Session:
    """Start (or join) the toolkit; on Ray, without Ray's crash handler in this process
    (unless the environment asks for one). The cluster's processes, started later, keep
    theirs: they do not inherit the setting."""
    if not local:
        given = os.environ.get(_NO_CRASH_HANDLER_ENV)
        os.environ.setdefault(_NO_CRASH_HANDLER_ENV, "1")
        try:
            session_factory("ray")  # imports Ray
        finally:
            if given is None:
                os.environ.pop(_NO_CRASH_HANDLER_ENV, None)
    joining = not local and bool(address or os.environ.get("RAY_ADDRESS"))
    try:
        return api.start(http_options=http, backend="local" if local else "auto", address=address)
    except ConnectionError as exc:
        if not joining:  # not from finding a cluster: its own traceback says more
            raise
        raise no_cluster(address or "auto", exc) from None


def _prepare(
    ctx: click.Context,
    target: str,
    args: dict[str, str],
    name: str | None,
    route_prefix: str | None,
    log_level: str,
    log_format: str,
    http_flags: dict[str, Any],
) -> tuple[HTTPOptions, Application | None]:
    """Before anything starts: logging, the environment the workers inherit, the HTTP
    options, and the app of an import path (imported now: a wrong path fails here, before
    a cluster starts for nothing, and arguments a builder cannot take are a usage error)."""
    _set_logging(log_level, log_format)
    # Ray worker processes import the user's module too: let them find it here.
    cwd = os.getcwd()
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH")) if p)
    # Every log line of the workers reaches this console as written: Ray's driver would
    # otherwise fold lines from different processes that differ only in their numbers
    # (two proxies' access lines for one route, say) into "[repeated Nx]", and it
    # spends more CPU per line doing so. Read before Ray is imported; yours wins.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if not _is_config_file(target):
        try:
            return parse_http_options(http_flags), load_application(target, args, name)
        except BuilderArgsError as exc:
            raise click.UsageError(str(exc), ctx) from None
    if args:
        raise click.UsageError(
            "KEY=VALUE arguments go to the builder an import path names; for a config file's "
            "application, set them under its args:",
            ctx,
        )
    if name is not None or route_prefix is not None:
        raise ConfigError("--name and --route-prefix apply to an import path; set them in the file")
    config = load_config(target)
    given = {k: v for k, v in http_flags.items() if _given(ctx, k)}
    logging_config = config.logging_config
    _set_logging(
        log_level if _given(ctx, "log_level") else logging_config.level_name(),
        log_format if _given(ctx, "log_format") else logging_config.encoding.lower(),
    )
    return parse_http_options({**config.http().model_dump(), **given}), None


def _announce(target: str, names: list[str], current: ServeStatus, http: HTTPOptions) -> None:
    """Where each application is served, and the live status page."""
    scheme = "https" if http.client_tls is not None else "http"
    fallback = None if http.proxy_location == "Disabled" else f"{scheme}://{http.host}:{http.port}"
    url = next(iter(current.proxy_urls.values()), fallback)
    for app_name in names:
        prefix = current.applications[app_name].route_prefix
        where = (
            "handles only" if url is None or prefix is None else f"{url.rstrip('/')}{http.root_path}{prefix}"
        )
        click.echo(
            f"app-toolkit: serving {target if len(names) == 1 else app_name} at {where} (Ctrl-C to stop)"
        )
    if url is not None:
        click.echo(f"app-toolkit: live status at {url.rstrip('/')}{http.root_path}/-/dashboard")


def _deploy(
    session: Session,
    target: str,
    args: dict[str, str],
    name: str | None,
    route_prefix: str | None,
    reload: bool,
    changed: Collection[str] = (),
    app: Application | None = None,
) -> list[str]:
    """Deploy an import path (``app``: what it names, if loaded already; a builder it
    names is called with ``args`` again on each reload) or a config file; returns the
    application names. ``reload``: as ``--reload`` deploys, the first time too (only
    what changed since is replaced: a first deploy renewed as ``tk.run``'s is would have
    versions no reload makes again); ``changed``: the files an edit changed, whose
    modules (and those that import them) are imported anew first."""
    if changed:
        _forget_stale_modules(os.getcwd(), changed)
    if _is_config_file(target):
        config = load_config(target)
        apply(session, config, target, wait_s=None, reload=reload)
        return [app.name for app in config.applications]
    if app is None:
        app = load_application(target, args, name)
    kwargs: dict[str, Any] = {"name": name, "_reload": reload}
    if route_prefix is not None:
        kwargs["route_prefix"] = route_prefix
    api.run(app, **kwargs)
    return [name or app.default_name or "default"]


def _redeploy_on_change(redeploy: Callable[[set[str]], list[str]]) -> None:
    """Watch the current folder's .py files; redeploy after each change (given the files
    it changed) until a stop signal interrupts it."""
    import watchfiles

    folder = os.getcwd()
    click.echo(f"app-toolkit: watching {folder} for changes")
    for changes in watchfiles.watch(folder, watch_filter=watchfiles.PythonFilter()):
        changed = ", ".join(sorted(os.path.relpath(path, folder) for _, path in changes))
        click.echo(f"app-toolkit: {changed} changed; redeploying")
        try:
            redeploy({path for _, path in changes})
        except Exception as exc:  # noqa: BLE001 - keep serving the last good version
            click.echo(f"app-toolkit: redeploy failed, the previous version keeps serving: {exc}", err=True)
        else:
            click.echo("app-toolkit: redeployed")


def _forget_stale_modules(folder: str, changed: Collection[str]) -> None:
    """Drop the user's modules loaded from ``folder`` that depend on a ``changed`` file
    (code_sources.py's rule) so they import anew; the others stay as they are (a model
    module's import-time work is not done again for an edit elsewhere)."""
    root = os.path.join(os.path.realpath(folder), "")
    local = []
    for module_name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and os.path.realpath(path).startswith(root) and is_user_source(path):
            local.append(module_name)
    for module_name in dependents(local, changed):
        del sys.modules[module_name]


def _set_logging(level: str, fmt: str) -> None:
    """The toolkit's log level and format here and, through the environment, in every
    toolkit process (``--local`` included: everything runs here)."""
    os.environ[LOG_LEVEL_ENV] = level.upper()
    os.environ[log_format.FORMAT_ENV] = fmt
    log_format.configure(level, fmt)


def _is_config_file(target: str) -> bool:
    return target.endswith((".yaml", ".yml")) or (os.path.isfile(target) and ":" not in target)


def _given(ctx: click.Context, parameter: str) -> bool:
    source = ctx.get_parameter_source(parameter)
    return source in (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
