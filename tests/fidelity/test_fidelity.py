"""Each app of the corpus answers the same through the toolkit as under plain uvicorn.

For every corpus app (tests/fidelity/corpus/) and every way the toolkit serves it — the
local backend, Ray with direct ingress, Ray through the proxy — one test serves the same
app object with a real uvicorn on 127.0.0.1 (``--root-path`` set to the toolkit's route
prefix, so the app sees the same scope) and deploys it on the toolkit, then sends both
the corpus's requests in the same order and compares status, headers and body (for a
WebSocket: handshake, messages and close; for raw bytes: every byte read back). A
failure lists each differing field of each named request.

Differences the toolkit has today are declared as :class:`Known` entries: their cases are
``xfail(strict=True)``, fail again on any other difference, and fail once fixed.

uvicorn runs in a thread of this process, so it serves under pytest's warnings-as-errors
(a warning in an app would be a 500 from uvicorn alone on Ray): corpus apps warn nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import pytest
from starlette.types import ASGIApp

import app_toolkit as tk
from tests.conftest import Toolkit, _toolkit_for, free_port
from tests.fidelity.compare import Exchange, UvicornThread, compare
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


#: The app object both servers serve, and the toolkit's application of it (given
#: direct_ingress).
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
    #: The toolkit's route_prefix (uvicorn's --root-path); by default /fidelity-{name}.
    prefix: str = ""

    def known_in(self, mode: str) -> list[Known]:
        return [entry for entry in self.known if mode in entry.modes]


SOCKETS = (
    Known(
        "deliberate (docs/http.md, WebSockets): an exception after accept closes with a 1011 "
        "close frame; uvicorn drops the connection without one (the client sees 1006)",
        exchanges=("error after accept",),
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


#: The shared toolkit of a backend, as the ``toolkit`` fixture gives it (and deleting what
#: the test deployed); here the test picks the backend from its mode.
_toolkit: Callable[[str], AbstractContextManager[Toolkit]] = contextmanager(_toolkit_for)


@pytest.mark.parametrize(("corpus", "mode"), list(_cases()))
def test_the_toolkit_answers_as_uvicorn(corpus: Corpus, mode: str) -> None:
    backend, direct = MODES[mode]
    prefix = corpus.prefix or f"/fidelity-{corpus.name}"
    root_path = prefix.rstrip("/")
    asgi, application = corpus.serve(direct)
    with UvicornThread(asgi, free_port(), root_path).running() as server, _toolkit(backend) as kit:
        kit.run(application, route_prefix=prefix)
        found = compare(corpus.exchanges, server.url, kit.url, root_path)
    expected = {name for entry in corpus.known_in(mode) for name in entry.exchanges}
    unknown = [str(difference) for difference in found if difference.exchange not in expected]
    assert not unknown, f"{corpus.name} on {mode} differs from uvicorn:\n" + "\n".join(unknown)
    fixed = expected - {difference.exchange for difference in found}
    assert not fixed, f"{corpus.name} on {mode} now answers {sorted(fixed)} as uvicorn: drop its Known entry"
    if found:
        raise KnownDifference("\n".join(map(str, found)))
