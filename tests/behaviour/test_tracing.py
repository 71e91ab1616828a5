"""W3C trace context: kept from the client (or started by the proxy) and carried through
two handle calls, each hop a child span of the one before, on both backends."""

from __future__ import annotations

from tests.apps import traced
from tests.conftest import Toolkit

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def _linked(spans: list[dict[str, str]], trace_id: str, first_parent: str) -> None:
    assert [s["trace"] for s in spans] == [trace_id] * 3
    assert spans[0]["parent"] == first_parent
    assert spans[1]["parent"] == spans[0]["span"] and spans[2]["parent"] == spans[1]["span"]
    assert len({s["span"] for s in spans} | {first_parent}) == 4  # every hop a span of its own


def test_a_traceparent_reaches_a_deployment_two_handle_calls_away(toolkit: Toolkit) -> None:
    toolkit.run(traced.make_app(), route_prefix="/traced")
    with toolkit.client() as client:
        headers = {"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01", "tracestate": "vendor=1"}
        spans = client.get("/traced/spans", headers=headers).json()
        _linked(spans, TRACE, CLIENT_SPAN)
        assert {s["state"] for s in spans} == {"vendor=1"}

        started = client.get("/traced/spans").json()  # no header: the proxy starts a trace
        assert len(started[0]["trace"]) == 32 and len(started[0]["parent"]) == 16
        _linked(started, started[0]["trace"], started[0]["parent"])

        for bad in ("garbage", f"00-{'0' * 32}-{CLIENT_SPAN}-01", f"ff-{TRACE}-{CLIENT_SPAN}-01"):
            replaced = client.get("/traced/spans", headers={"traceparent": bad, "tracestate": "x=1"}).json()
            assert replaced[0]["trace"] not in (TRACE, "0" * 32)  # a new trace, not the invalid one
            assert {s["state"] for s in replaced} == {""}  # its tracestate is dropped with it
            _linked(replaced, replaced[0]["trace"], replaced[0]["parent"])
