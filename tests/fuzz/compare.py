"""Whether the toolkit's outcome of a case is uvicorn's, or differs only in a way listed
here (each one stricter, and documented in docs/http.md, "Fuzzed against uvicorn").

Never allowed: a crash (a 5xx from the echo app's server, a reset, a hang), bytes that do
not parse as responses, or a request the app sees that uvicorn's app would not. (Where
uvicorn resets after a 4xx that closed the connection, the kernel's answer to the
client's later bytes, the toolkit, which lingers, closes: that close is uvicorn's reset.)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.fuzz.grammar import Case
from tests.fuzz.servers import Outcomes, Servers
from tests.fuzz.wire import PATIENT_S, Outcome

#: The refusals after which the server ends the connection (front/linger.py).
CLOSING_REFUSALS = frozenset({400, 408, 413, 431})

#: Headers the toolkit adds to what its app sees (docs/observability.md), not the client's.
ADDED_HEADERS = frozenset({"x-request-id", "traceparent", "tracestate"})


@dataclass(frozen=True)
class Difference:
    """A listed way the toolkit answers a case otherwise than uvicorn."""

    name: str
    #: Whether it explains these outcomes (uvicorn's, then the toolkit's).
    explains: Callable[[Case, Outcome, Outcome], bool]


def _trailers_dropped(case: Case, uvicorn: Outcome, toolkit: Outcome) -> bool:
    """A chunked body's trailer fields: uvicorn adds them to the request's headers when
    they arrive before its app reads the scope; the toolkit never does."""
    if uvicorn.statuses != toolkit.statuses or len(uvicorn.responses) != len(toolkit.responses):
        return False
    for theirs, ours in _pairs(uvicorn, toolkit):
        if theirs is None or ours is None:
            if (theirs is None) != (ours is None):
                return False
            continue
        if {**theirs, "headers": None} != {**ours, "headers": None}:
            return False
        extra = theirs["headers"][len(ours["headers"]) :]
        if theirs["headers"][: len(ours["headers"])] != ours["headers"]:
            return False
        if any(not _a_trailer(case, name, value) for name, value in extra):
            return False
    return True


def _a_trailer(case: Case, name: str, value: str) -> bool:
    """Whether ``case`` sends the field ``name: value`` after a chunked body's last chunk
    (a line ``0`` or ``0;ext``)."""
    data = case.data.lower()
    field = f"{name}:".encode("latin-1")
    for last_chunk in re.finditer(rb"(?:^|\n)0+(?:;[^\r\n]*)?\r?\n", data):
        trailers = data[last_chunk.end() :].split(b"\n\n", 1)[0].split(b"\r\n\r\n", 1)[0]
        if any(line.strip().startswith(field) for line in trailers.splitlines()):
            return True
    return False


def _no_continue_for_no_content(case: Case, uvicorn: Outcome, toolkit: Outcome) -> bool:
    """``Expect: 100-continue`` on a request whose framing says it has no content (or
    whose content has all arrived): the toolkit may skip the interim 100, as RFC 9110
    (10.1.1) allows; uvicorn sends it whenever its app reads the body."""
    if b"100-continue" not in case.data.lower():
        return False
    if toolkit.statuses.count(100) > uvicorn.statuses.count(100):
        return False

    def final(outcome: Outcome) -> Outcome:
        return Outcome(tuple(r for r in outcome.responses if r.status != 100), outcome.fate, outcome.garbled)

    return _same(final(uvicorn), final(toolkit))


def _finals(outcome: Outcome) -> list[int]:
    """The statuses of its final responses (no interim 100s)."""
    return [status for status in outcome.statuses if status != 100]


def _in_flight_dropped_at_a_parse_error(case: Case, uvicorn: Outcome, toolkit: Outcome) -> bool:
    """Bytes after a request that do not parse get their 400 at once and close the
    connection; a response still being made then is dropped. Which server drops one depends
    on whether its app had answered before the bad bytes were read (uvicorn's protocol,
    which parses every byte it has before its app answers, drops one when the bad bytes
    came with the request; the toolkit, when its app is slower): one outcome is the other's
    without such 2xx answers just before the same closing 4xx."""
    if toolkit.fate != "closed" or not toolkit.statuses or not 400 <= toolkit.statuses[-1] < 500:
        return False
    if uvicorn.statuses[-1:] != toolkit.statuses[-1:]:
        return False
    ours, theirs = toolkit.responses[:-1], uvicorn.responses[:-1]
    if len(ours) > len(theirs) and uvicorn.fate != "closed":
        return False
    both = min(len(ours), len(theirs))  # answered by both; the rest by one only (dropped by the other)
    extra = theirs[both:] if len(ours) <= len(theirs) else ours[both:]
    kept = _same(Outcome(theirs[:both], "closed"), Outcome(ours[:both], "closed"))
    return kept and all(200 <= response.status < 300 for response in extra)


def _the_toolkits_own_paths(case: Case, uvicorn: Outcome, toolkit: Outcome) -> bool:
    """Paths under ``/-/`` are the toolkit's built-in endpoints (docs/http.md): one it
    does not have is its 404, where uvicorn's app answered; everything else the same."""
    theirs_final = [r for r in uvicorn.responses if r.status != 100]  # no 100 before a 404
    ours_final = [r for r in toolkit.responses if r.status != 100]
    if len(theirs_final) != len(ours_final) or uvicorn.fate != toolkit.fate:
        return False
    for theirs, ours in zip(theirs_final, ours_final, strict=True):
        if theirs.seen is not None and theirs.seen["path"].startswith("/-/"):
            if ours.status != 404:
                return False
        elif not _same(Outcome((theirs,), "open"), Outcome((ours,), "open")):
            return False
    return True


DIFFERENCES: tuple[Difference, ...] = (
    Difference("trailer fields are not request headers", _trailers_dropped),
    Difference("no 100 Continue for a request with no content to wait for", _no_continue_for_no_content),
    Difference("a response in flight at a parse error is dropped", _in_flight_dropped_at_a_parse_error),
    Difference("paths under /-/ are the toolkit's own", _the_toolkits_own_paths),
)


def _request(seen: dict[str, Any], theirs: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the toolkit's app saw, without the headers the toolkit added (those of
    ``ADDED_HEADERS`` that uvicorn's app, given the same bytes, did not see)."""
    sent = [] if theirs is None else theirs["headers"]
    headers = [pair for pair in seen["headers"] if pair[0] not in ADDED_HEADERS or pair in sent]
    return {**seen, "headers": headers}


def _pairs(uvicorn: Outcome, toolkit: Outcome) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
    """What each server's app saw, response by response (the toolkit's normalised)."""
    pairs = []
    for index, ours in enumerate(toolkit.responses):
        theirs = uvicorn.responses[index].seen if index < len(uvicorn.responses) else None
        pairs.append((theirs, None if ours.seen is None else _request(ours.seen, theirs)))
    return pairs


def _same(uvicorn: Outcome, toolkit: Outcome) -> bool:
    if uvicorn.statuses != toolkit.statuses or uvicorn.fate != toolkit.fate:
        return False
    return all(theirs == ours for theirs, ours in _pairs(uvicorn, toolkit))


def _reset_as_the_toolkit_closes(uvicorn: Outcome, toolkit: Outcome) -> Outcome:
    """uvicorn's outcome, with a reset after a closing refusal counted as the close the
    toolkit's lingering gives (front/linger.py).

    uvicorn closes at once after a 4xx that ends the connection: bytes the client still
    sends meet a closed socket, and the kernel answers them with a reset, which may also
    destroy the refusal before the client reads it. The toolkit reads and drops those bytes
    first, so its client reads the refusal and then the close. When the toolkit's outcome is
    that close after uvicorn's answers (with the refusal the reset may have destroyed),
    uvicorn's reset counts as it."""
    if uvicorn.fate != "reset" or toolkit.fate != "closed" or not toolkit.responses:
        return uvicorn
    refusal = toolkit.responses[-1]  # the server's own (no app saw it) closing refusal
    if refusal.status not in CLOSING_REFUSALS or refusal.seen is not None:
        return uvicorn
    theirs = uvicorn.responses
    if not _same(Outcome(theirs, "closed"), Outcome(toolkit.responses, "closed")):
        theirs = (*theirs, toolkit.responses[-1])  # its refusal was lost to the reset
        if not _same(Outcome(theirs, "closed"), Outcome(toolkit.responses, "closed")):
            return uvicorn
    return Outcome(theirs, "closed", uvicorn.garbled)


def problem(case: Case, outcomes: Outcomes) -> str | None:
    """What is wrong with the toolkit's outcome of ``case``, or None."""
    toolkit = outcomes.toolkit
    uvicorn = _reset_as_the_toolkit_closes(outcomes.uvicorn, toolkit)
    if toolkit.fate in ("hung", "reset") and uvicorn.fate != toolkit.fate:
        return f"the toolkit's connection {toolkit.fate}"
    if toolkit.garbled and not uvicorn.garbled:
        return f"bytes that are not a response: {toolkit.garbled[:120]!r}"
    if any(status >= 500 for status in toolkit.statuses):
        return f"a server error: {toolkit.statuses}"
    if _same(uvicorn, toolkit):
        return None
    if case.close_early and _close_early_consistent(uvicorn, toolkit):
        return None
    for difference in DIFFERENCES:
        if difference.explains(case, uvicorn, toolkit):
            return None
    return "a difference not listed"


def verdict(servers: Servers, case: Case) -> tuple[str | None, Outcomes]:
    """What is wrong with the toolkit's outcome of ``case`` (None: nothing), and the
    outcomes. A case whose outcomes differ runs again, waiting longer for answers, before
    it counts: a slow answer is not a different one."""
    outcomes = servers.run(case)
    if problem(case, outcomes) is not None:
        outcomes = servers.run(case, quiet_s=PATIENT_S)
    return problem(case, outcomes), outcomes


def _close_early_consistent(uvicorn: Outcome, toolkit: Outcome) -> bool:
    """A client that shuts its side down after its last byte races the servers' answers
    (each may cancel a request it was serving): the toolkit's app saw only requests
    uvicorn's saw, in order."""
    sent = _finals(toolkit)
    if sent != _finals(uvicorn)[: len(sent)]:
        return False
    theirs = [response.seen for response in uvicorn.responses if response.seen is not None]
    seen = [response.seen for response in toolkit.responses if response.seen is not None]
    ours = [_request(one, theirs[i] if i < len(theirs) else None) for i, one in enumerate(seen)]
    return ours == theirs[: len(ours)]


def describe(case: Case, outcomes: Outcomes) -> str:
    """A failing case and both outcomes, for the test's message."""

    def one(outcome: Outcome) -> str:
        seen = [r.seen for r in outcome.responses]
        return f"statuses {outcome.statuses}, {outcome.fate}, garbled {outcome.garbled[:80]!r}, saw {seen}"

    return (
        f"case {case.data!r} split at {case.splits} close_early={case.close_early}\n"
        f"  uvicorn: {one(outcomes.uvicorn)}\n  toolkit: {one(outcomes.toolkit)}"
    )
