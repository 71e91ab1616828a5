"""The fuzzer's rule for a response in flight when bytes that do not parse arrive: either
server may drop it (which one depends on whether its app answered before the bad bytes
were read), and nothing else is excused by it."""

from __future__ import annotations

from tests.fuzz.compare import problem
from tests.fuzz.grammar import Case
from tests.fuzz.servers import Outcomes
from tests.fuzz.wire import Outcome, Response

CASE = Case(b"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\n\r\na\x01\r\n\r\n", requests=2)
SEEN = {"method": "POST", "path": "/echo", "body": "a", "headers": [["host", "localhost"]]}


def _outcome(*statuses: int, fate: str = "closed") -> Outcome:
    return Outcome(tuple(Response(s, SEEN if s == 200 else None) for s in statuses), fate)


def test_either_server_may_drop_the_answer_in_flight_at_a_parse_error() -> None:
    assert problem(CASE, Outcomes(_outcome(200, 400), _outcome(400))) is None  # the toolkit dropped it
    assert problem(CASE, Outcomes(_outcome(400), _outcome(200, 400))) is None  # uvicorn dropped it


def test_nothing_else_is_excused() -> None:
    not_listed = "a difference not listed"
    assert problem(CASE, Outcomes(_outcome(400), _outcome(404, 400))) == not_listed  # not a dropped 2xx
    assert problem(CASE, Outcomes(_outcome(400), _outcome(200, 431))) == not_listed  # another refusal
    assert problem(CASE, Outcomes(_outcome(400, fate="open"), _outcome(200, 400))) == not_listed


def test_the_toolkit_closes_where_uvicorn_resets_after_a_closing_refusal() -> None:
    """The toolkit lingers after a refusal (front/linger.py): its client reads the 4xx and
    the close where uvicorn's gets a reset, which may have destroyed uvicorn's 4xx too."""
    assert problem(CASE, Outcomes(_outcome(200, 400, fate="reset"), _outcome(200, 400))) is None
    assert problem(CASE, Outcomes(_outcome(200, fate="reset"), _outcome(200, 400))) is None
    # A reset from the toolkit is never excused, nor a close after other answers.
    assert problem(CASE, Outcomes(_outcome(200, 400), _outcome(200, 400, fate="reset"))) is not None
    assert problem(CASE, Outcomes(_outcome(400, fate="reset"), _outcome(404, 400))) is not None
    assert (
        problem(CASE, Outcomes(_outcome(200, fate="reset"), _outcome(200, 404))) is not None
    )  # not a refusal
