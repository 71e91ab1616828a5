"""Each app of the corpus answers the same through the toolkit as under plain uvicorn.

For every corpus app (tests/fidelity/corpus/) and every way the toolkit serves it — the
local backend, Ray with direct ingress, Ray through the proxy — one test sends the
corpus's requests in the same order to the app deployed on the toolkit and to the same
app under a real uvicorn on 127.0.0.1 (``--root-path`` set to the toolkit's route prefix,
so the app sees the same scope), and compares status, headers and body (for a WebSocket:
handshake, messages and close; for raw bytes: every byte read back). A failure lists each
differing field of each named request.

A Ray replica's start (a process: about a second of a core) is most of what a test costs,
so the tests share what they can, and uvicorn always sees the prefix the toolkit serves at:

- on Ray, an app's direct and proxied applications are deployed side by side, the proxied
  one at a prefix of its own (``/fidelity-{name}-proxied``), and start together; an app
  served at ``/`` takes its modes in turn. (Under pytest-xdist the first mode's worker
  deploys both; should the other mode's test go to another worker, it deploys there too.)
- uvicorn's answers for an app at a root_path are asked once, for every mode that serves
  it at that prefix (the local one and Ray's direct one share theirs); uvicorn finishes
  each exchange before the next is sent, so a connection it closes after an answer is
  seen closed (what asking the toolkit in between used to leave time for);
- an app is deleted without waiting for its replicas when the next one is deployed; the
  module's end waits until all are gone.

Differences the toolkit has today are declared as :class:`Known` entries: their cases are
``xfail(strict=True)``, fail again on any other difference, and fail once fixed.

uvicorn runs in a thread of this process, so it serves under pytest's warnings-as-errors
(a warning in an app would be a 500 from uvicorn alone on Ray): corpus apps warn nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest
from starlette.types import ASGIApp

import app_toolkit as tk
from app_toolkit._runtime.backends.base import current_session
from app_toolkit._runtime.front import uvicorn_compat
from app_toolkit._runtime.session import Session
from app_toolkit.api import wait_for_application
from app_toolkit.build import build_app
from tests.conftest import Toolkit, _ensure_backend, free_port
from tests.fidelity.compare import Answer, Exchange, UvicornThread, ask, compare
from tests.fidelity.corpus import (
    dependencies,
    forms,
    handlers,
    issue47,
    middleware,
    models,
    mounts,
    raw,
    responses,
    scope,
    sockets,
)
from tests.waiting import wait_for

#: How the toolkit serves an app: backend, and on Ray whether the ingress replica serves
#: its connections itself (direct_ingress) or the proxy forwards each request.
MODES = {"local": ("local", True), "ray-direct": ("ray", True), "ray-proxied": ("ray", False)}


class KnownDifference(Exception):
    """Only the differences a :class:`Known` names were found (an expected failure)."""


@dataclass(frozen=True)
class Known:
    """A difference the toolkit is known to have today: the case is marked
    ``xfail(strict=True)``, and the mark flips to a failure once it is fixed. Any other
    difference of the same case still fails it."""

    reason: str
    modes: tuple[str, ...] = tuple(MODES)
    #: The exchanges that differ; none: deploying the app fails (with ``raises``).
    exchanges: tuple[str, ...] = ()
    raises: type[Exception] = KnownDifference


#: An app object, and the toolkit's application of it (given direct_ingress). uvicorn and
#: each deploy take theirs from a call of their own: the same object for a module-level
#: app, a fresh one where the corpus builds its app per use.
Served = tuple[ASGIApp, tk.Application]


def as_app(asgi: ASGIApp, **options: object) -> Callable[[bool], Served]:
    def build(direct: bool) -> Served:
        return asgi, tk.App(asgi, direct_ingress=direct, **options)  # type: ignore[arg-type]  # any ASGI app

    return build


def graphql_app(direct: bool) -> Served:
    app = issue47.make_graphql_app()
    return app, tk.App(app, direct_ingress=direct)


def graphql(direct: bool) -> Served:
    app = issue47.make_graphql_app()
    return app, issue47.graphql_ingress(app).options(direct_ingress=direct).bind()


@dataclass(frozen=True)
class Corpus:
    """One app of the corpus: what uvicorn serves, what the toolkit deploys, what to send."""

    name: str
    exchanges: Sequence[Exchange]
    serve: Callable[[bool], Served]
    known: Sequence[Known] = ()
    #: The toolkit's route_prefix (uvicorn's --root-path) in every mode; by default
    #: /fidelity-{name}, and /fidelity-{name}-proxied for Ray's proxied mode.
    prefix: str = ""

    def known_in(self, mode: str) -> list[Known]:
        return [entry for entry in self.known if mode in entry.modes]

    def route_prefix(self, mode: str) -> str:
        """Where ``mode`` serves the app (Ray's proxied mode runs beside the direct one)."""
        if self.prefix:
            return self.prefix
        return f"/fidelity-{self.name}" + ("-proxied" if mode == "ray-proxied" else "")


#: uvicorn's sans-I/O WebSocket protocol before 0.42 leaves root_path out of a WebSocket's
#: scope["path"]; the toolkit's has it, as the ASGI spec, uvicorn's legacy protocol and
#: later uvicorn do (docs/compatibility.md).
UVICORN_WS_PATH_WITHOUT_ROOT = uvicorn_compat.RELEASE < (0, 42)

SOCKETS = (
    Known(
        "deliberate (docs/http.md, WebSockets): an exception after accept closes with a 1011 "
        "close frame; uvicorn drops the connection without one (the client sees 1006)",
        exchanges=("error after accept",),
    ),
    *(
        [
            Known(
                "uvicorn < 0.42: its sans-I/O WebSocket scope's path lacks root_path; the "
                "toolkit's has it, as the ASGI spec and later uvicorn",
                exchanges=("headers, cookies and query",),
            )
        ]
        if UVICORN_WS_PATH_WITHOUT_ROOT
        else []
    ),
)

CORPUS = [
    # FastAPI's own /docs page, not the toolkit's offline one (docs/http.md).
    Corpus("scope", scope.EXCHANGES, as_app(scope.app, offline_docs=False)),
    Corpus("scope_at_root", scope.EXCHANGES, as_app(scope.app, offline_docs=False), prefix="/"),
    Corpus("models", models.EXCHANGES, as_app(models.app)),
    Corpus("dependencies", dependencies.EXCHANGES, as_app(dependencies.app)),
    Corpus("handlers", handlers.EXCHANGES, as_app(handlers.app)),
    Corpus("sockets", sockets.EXCHANGES, as_app(sockets.app), SOCKETS),
    Corpus("responses", responses.EXCHANGES, as_app(responses.app)),
    Corpus("middleware", middleware.EXCHANGES, as_app(middleware.app)),
    Corpus("mounts", mounts.EXCHANGES, as_app(mounts.app)),
    Corpus("forms", forms.EXCHANGES, as_app(forms.app)),
    Corpus("raw_asgi", raw.EXCHANGES, as_app(raw.app)),
    # Issue #47 items 1-3, each served as under uvicorn on current main: duplicate routes
    # (were refused at deploy), a module-level app mounting a WSGI app that holds a
    # database connection (failed to deploy on Ray), a GraphQL-style router included
    # lazily, by tk.App and under @tk.ingress (lost its annotations on Ray).
    Corpus("duplicates", issue47.DUPLICATES, as_app(issue47.duplicates)),
    Corpus("wsgi_connection", issue47.WSGI_WITH_CONNECTION, as_app(issue47.wsgi_with_connection)),
    Corpus("graphql_app", issue47.GRAPHQL, graphql_app),
    Corpus("graphql", issue47.GRAPHQL, graphql),
]


def _cases() -> Iterator[object]:
    for corpus in CORPUS:
        for mode in MODES:
            entries = corpus.known_in(mode)
            marks = []
            if entries:
                reason = "; ".join(entry.reason for entry in entries)
                raises = tuple(dict.fromkeys(entry.raises for entry in entries))
                marks.append(pytest.mark.xfail(strict=True, reason=reason, raises=raises))
            yield pytest.param(corpus, mode, id=f"{corpus.name}-{mode}", marks=marks)


class UvicornAnswers:
    """uvicorn's answers to a corpus app's exchanges at a root_path (the toolkit's route
    prefix), asked once for every mode that serves the app there (a deploy sends an app as
    it is, so an app built per use is served by uvicorn from a call of ``serve`` of its
    own). uvicorn settles after each exchange (:meth:`UvicornThread.settle`), as between
    two clients' requests. Each server stops while the tests go on; :meth:`close` waits."""

    def __init__(self) -> None:
        self._answers: dict[tuple[str, str], tuple[Answer, ...]] = {}
        self._servers: list[UvicornThread] = []

    def __call__(self, corpus: Corpus, root_path: str) -> tuple[Answer, ...]:
        key = (corpus.name, root_path)
        if key not in self._answers:
            asgi, _ = corpus.serve(True)
            server = UvicornThread(asgi, free_port(), root_path)
            self._servers.append(server)
            with server.running():
                self._answers[key] = ask(corpus.exchanges, server.url, "", settle=server.settle)
        return self._answers[key]

    def close(self) -> None:
        for server in self._servers:
            server.join()


def together(corpus: Corpus, mode: str) -> list[str]:
    """``mode`` and the other modes of its backend that can run beside it (at another
    prefix): deployed at once, their replicas start side by side."""
    backend, _ = MODES[mode]
    beside = [other for other, (on, _) in MODES.items() if on == backend and other != mode]
    return [mode] + [other for other in beside if corpus.route_prefix(other) != corpus.route_prefix(mode)]


class Deployments:
    """The corpus on the toolkit, for this module's tests: :meth:`url` deploys an app in
    the modes :func:`together` gives, and a later mode's test finds it running. The app
    before is deleted without waiting (its replicas stop while the next ones start), unless
    it held a prefix the next one takes; :meth:`close` deletes all and waits until they are
    gone, so the backend is left as the ``toolkit`` fixture leaves it."""

    def __init__(self) -> None:
        self.kit: Toolkit | None = None
        self.corpus: Corpus | None = None
        #: The running app's applications by mode, and what their deploys raised.
        self.names: dict[str, str] = {}
        self.failed: dict[str, Exception] = {}
        #: Applications deleted and not yet seen gone, with their prefixes.
        self.deleting: dict[str, str] = {}

    def url(self, corpus: Corpus, mode: str) -> str:
        """The toolkit's URL once ``corpus`` runs in ``mode``; raises what its deploy raised."""
        if corpus is not self.corpus or mode not in self.names:
            self._deploy(corpus, together(corpus, mode))
        if mode in self.failed:
            raise self.failed[mode]
        assert self.kit is not None
        return self.kit.url

    def close(self) -> None:
        self._delete()
        self._wait_gone(list(self.deleting))

    def _deploy(self, corpus: Corpus, modes: list[str]) -> None:
        backend, _ = MODES[modes[0]]
        if self.kit is None or self.kit.backend != backend:
            self.close()
            self.kit = _ensure_backend(backend)
        self._delete()
        prefixes = {corpus.route_prefix(mode) for mode in modes}
        self._wait_gone([name for name, prefix in self.deleting.items() if prefix in prefixes])
        session = _session()
        self.corpus = corpus
        for mode in modes:  # tk.run's steps, without waiting for one app before the next
            self.names[mode] = name = f"fidelity-{corpus.name}-{mode}"
            _, direct = MODES[mode]
            _, application = corpus.serve(direct)
            try:
                session.deploy(build_app(application, name, corpus.route_prefix(mode), session.serialize))
            except Exception as exc:  # noqa: BLE001 - raised by this mode's test, not the other's
                self.failed[mode] = exc
        for mode, name in self.names.items():
            try:
                if mode not in self.failed:
                    wait_for_application(session, name)
            except tk.DeployError as exc:
                self.failed[mode] = exc

    def _delete(self) -> None:
        """Delete the running app's applications, without waiting for their replicas."""
        for mode, name in self.names.items():
            assert self.corpus is not None
            _session().delete(name)
            self.deleting[name] = self.corpus.route_prefix(mode)
        self.corpus = None
        self.names.clear()
        self.failed.clear()

    def _wait_gone(self, names: list[str]) -> None:
        if names:
            session = _session()
            wait_for(lambda: all(map(session.app_gone, names)), 30, f"{names} to be gone")
        for name in names:
            del self.deleting[name]


def _session() -> Session:
    session = current_session(create=False)
    assert session is not None, "the backend this module deployed on has stopped"
    return session


@pytest.fixture(scope="module")
def deployments() -> Iterator[Deployments]:
    deployments = Deployments()
    try:
        yield deployments
    finally:
        deployments.close()


@pytest.fixture(scope="session")  # the local and Ray halves of the module run apart
def uvicorn_answers() -> Iterator[UvicornAnswers]:
    answers = UvicornAnswers()
    try:
        yield answers
    finally:
        answers.close()


@pytest.mark.parametrize(("corpus", "mode"), list(_cases()))
def test_the_toolkit_answers_as_uvicorn(
    corpus: Corpus, mode: str, deployments: Deployments, uvicorn_answers: UvicornAnswers
) -> None:
    url = deployments.url(corpus, mode)
    root_path = corpus.route_prefix(mode).rstrip("/")
    answers = ask(corpus.exchanges, url, root_path)
    found = compare(corpus.exchanges, uvicorn_answers(corpus, root_path), answers)
    expected = {name for entry in corpus.known_in(mode) for name in entry.exchanges}
    unknown = [str(difference) for difference in found if difference.exchange not in expected]
    assert not unknown, f"{corpus.name} on {mode} differs from uvicorn:\n" + "\n".join(unknown)
    fixed = expected - {difference.exchange for difference in found}
    assert not fixed, f"{corpus.name} on {mode} now answers {sorted(fixed)} as uvicorn: drop its Known entry"
    if found:
        raise KnownDifference("\n".join(map(str, found)))
