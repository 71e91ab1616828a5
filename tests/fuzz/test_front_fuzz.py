"""The HTTP front against uvicorn ``--http httptools``, the same bytes to both: the
regression corpus (whole, and byte by byte), then a fixed, seeded count of generated
cases (``make fuzz`` runs many more). The toolkit answers as uvicorn does, or in a way
``compare.py`` lists; never a crash, a hang, a reset or a garbled response."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, seed, settings

import app_toolkit as tk
from tests import plain_http
from tests.conftest import _ensure_backend, free_port
from tests.fuzz.compare import describe, verdict
from tests.fuzz.corpus import entries
from tests.fuzz.grammar import Case, cases
from tests.fuzz.logs import LogWatch
from tests.fuzz.servers import Servers, deploy_echo, uvicorn_echo
from tests.fuzz.wire import PATIENT_S

#: Generated cases ``make test`` runs (about 10 s on CI's two cores), and their seed.
GENERATED = 120
SEED = 20261127

CORPUS = entries()


@dataclass
class Fuzzing:
    servers: Servers
    logs: LogWatch

    def check(self, case: Case) -> None:
        """``case`` to every server: the toolkit answers as uvicorn does (or as listed), and
        its processes log no traceback."""
        wrong, outcomes = verdict(self.servers, case)
        assert wrong is None, f"{wrong}: {describe(case, outcomes)}"
        tracebacks = self.logs.tracebacks()
        assert not tracebacks, f"a traceback after {case}:\n{tracebacks[0]}"


@pytest.fixture(scope="module", params=["ray"])  # "[ray]": the toolkit's proxy and replicas on Ray
def fuzzing(request: pytest.FixtureRequest) -> Iterator[Fuzzing]:
    kit = _ensure_backend(request.param)
    name = kit.name()
    apps = deploy_echo(name)
    uvicorn_port = free_port()
    try:
        with uvicorn_echo(uvicorn_port), ThreadPoolExecutor(2) as pool:
            yield Fuzzing(Servers(uvicorn_port, int(kit.url.rsplit(":", 1)[1]), pool), LogWatch(apps))
    finally:
        for app in apps:
            tk.delete(app)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_entries_whole_and_byte_by_byte(fuzzing: Fuzzing, name: str) -> None:
    case = CORPUS[name]
    for fed in (case, case.bytewise()):
        fuzzing.check(fed)


@pytest.mark.parametrize("path", ["/echo", "/proxied/echo"])
def test_trailer_fields_never_reach_the_app_as_headers(fuzzing: Fuzzing, path: str) -> None:
    """A field after a chunked body's last chunk is not part of the request's head: the
    app never sees it, however the bytes arrive (uvicorn shows it when they come in one
    read; docs/http.md)."""
    data = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
        "3\r\nabc\r\n0\r\nX-T: 1\r\nX-Request-ID: forged\r\n\r\n"
    ).encode()
    for fed in (Case(data), Case(data).bytewise()):
        outcome = fuzzing.servers.run(fed, quiet_s=PATIENT_S).toolkit
        assert outcome.statuses == [200]
        seen = outcome.responses[0].seen
        assert seen is not None and seen["body"] == "abc"
        assert [name for name, _ in seen["headers"]] == ["host", "transfer-encoding"]


def test_generated_cases(fuzzing: Fuzzing) -> None:
    @seed(SEED)
    @settings(
        max_examples=GENERATED,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(cases())
    def same_as_uvicorn(case: Case) -> None:
        fuzzing.check(case)

    same_as_uvicorn()
    # The proxy still serves everyone else, and logged nothing more meanwhile.
    assert (
        plain_http.get(f"http://127.0.0.1:{fuzzing.servers.toolkit_port}/-/healthz", timeout=10).status_code
        == 200
    )
    assert not fuzzing.logs.settled()
