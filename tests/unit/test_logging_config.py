"""``logging_config`` of applications and deployments: parsed in code and in files, the
application's the default of its deployments, and what replicas and fronts do with it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

import app_toolkit as tk
from app_toolkit._runtime import log_format, request_context
from app_toolkit._runtime.front.http_front import HTTPFront
from app_toolkit._runtime.messages import DeploymentID, RouteInfo
from app_toolkit._runtime.replica.replica import ReplicaCore
from app_toolkit._runtime.tables import APPLICATIONS_KEY, ApplicationTable
from app_toolkit.build import build_app, build_spec
from app_toolkit.config import DeploymentConfig, HTTPOptions
from app_toolkit.config.file import parse_config
from app_toolkit.replica_id import ReplicaID
from app_toolkit.status import ApplicationStatus
from tests.deployments import as_deployment
from tests.unit.scopes import linked
from tests.unit.test_controller import FakeBackend, started, until
from tests.unit.test_controller import app as controller_app


@tk.deployment("Model")
class _Model:
    pass


@tk.deployment("Ingress", logging_config={"log_level": "DEBUG"})
class _Ingress:
    def __init__(self, model: tk.DeploymentHandle) -> None:
        self.model = model


Model, Ingress = as_deployment(_Model), as_deployment(_Ingress)


def test_code_takes_a_dict_or_a_logging_config_and_names_bad_fields() -> None:
    quiet = Model.options(logging_config=tk.LoggingConfig(log_level="warning", encoding="JSON"))
    assert quiet.config.logging_config == tk.LoggingConfig(log_level="WARNING", encoding="JSON")
    assert Model.options(logging_config={"log_level": 40}).config.logging_config == tk.LoggingConfig(
        log_level="ERROR"
    )
    assert Model.config.logging_config is None  # unset: its application's, else the process's
    for options, message in [
        ({"log_level": "LOUD"}, "logging_config.log_level must be DEBUG, INFO"),
        ({"log_level": 15}, "logging_config.log_level must be DEBUG"),
        ({"encoding": "XML"}, "logging_config.encoding Input should be 'TEXT' or 'JSON'"),
        ({"logs_dir": "/var/log"}, "logging_config.logs_dir a Ray Serve option .*standard error.* remove it"),
        ({"additional_log_standard_attrs": ["lineno"]}, "additional_log_standard_attrs a Ray Serve option"),
        ({"colour": "red"}, "unknown option 'logging_config.colour'"),
    ]:
        with pytest.raises(tk.ConfigError, match=message):
            tk.deployment(logging_config=options)(Model.func_or_class)
    # What Ray Serve writes for "not used" is accepted.
    tk.LoggingConfig.model_validate({"logs_dir": None, "additional_log_standard_attrs": []})


def test_files_set_it_per_application_and_per_deployment() -> None:
    text = """
applications:
- name: a
  import_path: tests.apps.config_apps:build
  logging_config: {log_level: WARNING, enable_access_log: false}
  deployments:
  - name: Greeter
    logging_config: {encoding: JSON}
"""
    (app,) = parse_config(yaml.safe_load(text), "serve.yaml").applications
    spec = build_spec(app, lambda value: b"x")
    front, greeter = spec.deployment("Front").config, spec.deployment("Greeter").config
    # The application's is the default of its deployments; a deployment's own wins whole.
    assert front.logging_config == tk.LoggingConfig(log_level="WARNING", enable_access_log=False)
    assert greeter.logging_config == tk.LoggingConfig(encoding="JSON")
    bad = yaml.safe_load(text.replace("encoding: JSON", "logs_dir: /tmp/x"))
    with pytest.raises(
        tk.ConfigError, match=r"deployments\[0\] \(Greeter\)\.logging_config\.logs_dir: a Ray Serve option"
    ):
        parse_config(bad, "serve.yaml")
    bad = yaml.safe_load(text.replace("log_level: WARNING", "log_level: LOUD"))
    with pytest.raises(tk.ConfigError, match=r"\(a\)\.logging_config\.log_level: must be DEBUG"):
        parse_config(bad, "serve.yaml")


def _keep(value: object) -> bytes:
    return repr(type(value)).encode()  # stable bytes, nothing pickled


def test_run_s_logging_config_is_the_default_and_changes_no_code_version() -> None:
    app = Ingress.bind(Model.bind())
    plain = build_app(app, "a", "/", _keep)
    assert plain.deployment("Model").config.logging_config is None
    quiet = build_app(app, "a", "/", _keep, logging_config=tk.LoggingConfig(log_level="ERROR"))
    assert quiet.deployment("Model").config.logging_config == tk.LoggingConfig(log_level="ERROR")
    assert quiet.deployment("Ingress").config.logging_config == tk.LoggingConfig(log_level="DEBUG")
    # Replicas take it in place (as they take user_config): no new version, no restart.
    assert "logging_config" in DeploymentConfig.in_place_options()
    for name in ("Model", "Ingress"):
        assert quiet.deployment(name).code_version == plain.deployment(name).code_version


class TwoApps:
    """A subscriber with two applications, one whose ingress writes no access lines."""

    def watch(self, key: str, apply: Any) -> Any:
        apply(
            ApplicationTable(
                (
                    RouteInfo("/loud", "loud", DeploymentID("loud", "Ingress")),
                    RouteInfo("/quiet", "quiet", DeploymentID("quiet", "Ingress"), access_log=False),
                )
            )
        )
        return None

    def dispatcher(self, deployment: DeploymentID) -> Any:
        return None


@pytest.mark.anyio
async def test_the_front_writes_no_access_line_for_an_application_that_turned_them_off() -> None:
    front = HTTPFront(TwoApps(), HTTPOptions(max_request_body_bytes=1))  # type: ignore[arg-type]
    access_log = front.rules.access_log
    assert access_log is not None
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=linked(front)), base_url="http://x"
    ) as client:
        for path in ("/loud/a", "/quiet/a", "/nowhere"):  # 413s: no replica asked
            await client.post(path, content=b"xx")
    pending = access_log._pending
    assert [(entry[3], entry[9]) for entry in pending] == [("/loud/a", "loud"), ("/nowhere", "")]
    access_log._cancel_timer()


@pytest.fixture
def toolkit_handler() -> Iterator[None]:
    """The root logger set aside (pytest's handlers off it) for the toolkit's handler,
    which a test installs (under capsys), and restored after."""
    root, toolkit = logging.getLogger(), logging.getLogger("app_toolkit")
    access = logging.getLogger("app_toolkit.access")
    saved = (root.handlers[:], root.level, toolkit.level, access.level)
    root.handlers = []
    yield
    root.handlers, levels = saved[0], saved[1:]
    for logger, level in zip((root, toolkit, access), levels, strict=True):
        logger.setLevel(level)


def _log_in_replica(app: str, deployment: str) -> None:
    replica_id = ReplicaID(f"{deployment}#1", DeploymentID(app, deployment))
    token = request_context.replica.set(request_context.ReplicaContext(app, deployment, replica_id))
    try:
        logging.getLogger("user.code").info("%s says info", deployment)
        logging.getLogger("user.code").warning("%s says warning", deployment)
    finally:
        request_context.replica.reset(token)


def test_replicas_sharing_a_process_drop_records_below_their_deployment_s_level(
    toolkit_handler: None, capsys: pytest.CaptureFixture[str]
) -> None:
    log_format.configure("info", "text")
    log_format.follow_deployment("a", "Quiet", tk.LoggingConfig(log_level="WARNING"), whole_process=False)
    log_format.follow_deployment("a", "Loud", tk.LoggingConfig(log_level="INFO"), whole_process=False)
    try:
        _log_in_replica("a", "Quiet")
        _log_in_replica("a", "Loud")
        logging.getLogger("user.code").info("outside any replica")
    finally:
        log_format.follow_deployment("a", "Quiet", None, whole_process=False)
        log_format.follow_deployment("a", "Loud", None, whole_process=False)
    err = capsys.readouterr().err
    assert "Quiet says warning" in err and "Quiet says info" not in err
    assert "Loud says info" in err and "outside any replica" in err
    _log_in_replica("a", "Quiet")  # its level forgotten: the process's again
    assert "Quiet says info" in capsys.readouterr().err


def test_a_replica_with_its_own_process_sets_every_logger_and_the_format(
    toolkit_handler: None, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tk.LoggingConfig(log_level="DEBUG", encoding="JSON")
    log_format.follow_deployment("a", "Solo", config, whole_process=True)
    logging.getLogger("user.code").debug("debug shows")
    # Access lines keep the process's level: enable_access_log decides about them.
    assert logging.getLogger("app_toolkit.access").getEffectiveLevel() == logging.INFO
    log_format.follow_deployment("a", "Solo", tk.LoggingConfig(log_level="ERROR"), whole_process=True)
    logging.getLogger("user.code").warning("warning hidden")
    logging.getLogger("app_toolkit.replica").warning("toolkit warning hidden")
    assert logging.getLogger("app_toolkit.access").getEffectiveLevel() == logging.INFO
    log_format.follow_deployment("a", "Solo", None, whole_process=True)  # back to the process's
    logging.getLogger("user.code").info("info shows")
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("{") and '"message": "debug shows"' in err[0]
    assert len(err) == 2 and err[1].endswith("user.code: info shows")


@pytest.mark.anyio
async def test_a_new_logging_config_reconfigures_replicas_in_place_and_republishes_the_access_flag() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([controller_app()])
    await until(lambda: core.snapshot().applications["a"].status is ApplicationStatus.RUNNING)
    quiet = {"log_level": "WARNING", "enable_access_log": False}
    await core.deploy_apps([controller_app(logging_config=quiet)])  # the same version
    await until(lambda: len(backend.reconfigured) == 2)
    assert backend.started == 2  # nothing restarted
    routes = core.longpoll.get(APPLICATIONS_KEY)
    assert isinstance(routes, ApplicationTable) and [r.access_log for r in routes.applications] == [False]
    await core.stop()


@pytest.mark.anyio
async def test_a_replica_follows_its_logging_config_when_it_starts_and_when_it_changes() -> None:
    deployment = DeploymentID("a", "Quiet")
    config = DeploymentConfig(logging_config={"log_level": "ERROR"})
    core = ReplicaCore("r1", deployment, config, lambda: None, ((), {}), lambda value: b"")
    await core.start()
    assert log_format._floors[("a", "Quiet")] == logging.ERROR
    await core.update_config(DeploymentConfig(logging_config={"log_level": "WARNING"}))
    assert log_format._floors[("a", "Quiet")] == logging.WARNING
    await core.update_config(DeploymentConfig())
    assert ("a", "Quiet") not in log_format._floors
