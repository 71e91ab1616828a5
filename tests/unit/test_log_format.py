"""Log lines: text with timestamps or JSON, with the request and replica they belong to."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator

import pytest

from app_toolkit._runtime import log_format, request_context
from app_toolkit.deployment_id import DeploymentID
from app_toolkit.replica_id import ReplicaID


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    level = logging.getLogger("app_toolkit").level
    replica = request_context.replica.set(
        request_context.ReplicaContext(
            "shop", "Ingress", ReplicaID("shop.Ingress.ab12", DeploymentID("shop", "Ingress"))
        )
    )
    with request_context.request_scope("req-7"):
        yield
    request_context.replica.reset(replica)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == "app_toolkit"]:
        root.removeHandler(handler)
    logging.getLogger("app_toolkit").setLevel(level)


# Each test logs as if inside replica shop.Ingress.ab12, serving request req-7 (fixture).


def test_json_lines_carry_time_level_logger_and_context(capsys: pytest.CaptureFixture[str]) -> None:
    log_format.configure("info", "json")
    logger = logging.getLogger("app_toolkit.test")
    logger.info("served %s", "it")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    logging.getLogger("user.code").warning("from the app", extra={"route": "/items/{item_id}"})
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [entry["message"] for entry in lines] == ["served it", "failed", "from the app"]
    first = lines[0]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["timestamp"])
    assert (first["level"], first["logger"]) == ("INFO", "app_toolkit.test")
    assert (first["request_id"], first["application"], first["deployment"], first["replica"]) == (
        "req-7",
        "shop",
        "Ingress",
        "shop.Ingress.ab12",
    )
    assert "ValueError: boom" in lines[1]["exception"]
    assert lines[2]["logger"] == "user.code" and lines[2]["route"] == "/items/{item_id}"


def test_text_lines_have_a_timestamp_and_the_level_applies(capsys: pytest.CaptureFixture[str]) -> None:
    log_format.configure("warning", "text")
    logger = logging.getLogger("app_toolkit.test")
    logger.info("too quiet to show")
    logger.warning("shown")
    err = capsys.readouterr().err
    assert "too quiet" not in err
    line = err.strip()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}"
    pattern = stamp + r" WARNING app_toolkit\.test \[shop\.Ingress\.ab12 req-7\]: shown"
    assert re.fullmatch(pattern, line), line
    log_format.configure("debug", "text")  # configuring again replaces, never doubles, the handler
    logger.debug("once")
    assert capsys.readouterr().err.count("once") == 1
