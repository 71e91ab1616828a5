"""The fidelity suite's comparison (tests/fidelity/compare.py) reports what differs."""

from __future__ import annotations

import pytest

from tests.fidelity.compare import IGNORED_HEADERS, Answer, Http, differences, header_multiset


def test_headers_are_a_multiset_with_each_names_values_in_order() -> None:
    sent = [("B", "1"), ("a", "x"), ("b", "2"), ("Date", "now"), ("x-request-id", "r")]
    assert header_multiset(sent, IGNORED_HEADERS) == [("a", "x"), ("b", "1"), ("b", "2")]
    # Another order of different names is the same; another order of one name's values is not.
    assert header_multiset([("b", "1"), ("b", "2"), ("a", "x")], IGNORED_HEADERS) == header_multiset(
        sent, IGNORED_HEADERS
    )
    assert header_multiset([("b", "2"), ("b", "1"), ("a", "x")], IGNORED_HEADERS) != header_multiset(
        sent, IGNORED_HEADERS
    )
    # allow's items come in a set's order, which differs per process.
    assert header_multiset([("allow", "POST, GET")], IGNORED_HEADERS) == [("allow", "GET, POST")]


def test_each_differing_field_is_named_with_both_values() -> None:
    request = Http("the request")
    uvicorn = Answer({"status": "200 OK", "headers": [("a", "1"), ("b", "2")], "body": b"same"})
    toolkit = Answer({"status": "201 Created", "headers": [("a", "1"), ("c", "3")], "body": b"same"})
    found = [str(difference) for difference in differences(request, uvicorn, toolkit)]
    assert found == [
        "'the request' headers: uvicorn only [('b', '2')], toolkit only [('c', '3')]",
        "'the request' status: uvicorn '200 OK', toolkit '201 Created'",
    ]
    assert differences(request, uvicorn, uvicorn) == []


def test_a_long_body_is_shown_from_where_it_differs() -> None:
    uvicorn = Answer({"body": b"x" * 500 + b"uvicorn's end"})
    toolkit = Answer({"body": b"x" * 500 + b"toolkit's end"})
    (found,) = differences(Http("long"), uvicorn, toolkit)
    assert found.exchange == "long"
    assert "from offset 500 (of 513, 513)" in found.text
    assert "uvicorn's end" in found.text and "toolkit's end" in found.text


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        pytest.param(  # Max-Age wins: a date from the clock is a placeholder
            'gone=""; expires=Thu, 26 Nov 2026 06:44:45 GMT; Max-Age=0; Path=/; SameSite=lax',
            'gone=""; expires=Thu, 26 Nov 2026 06:44:46 GMT; Max-Age=0; Path=/; SameSite=lax',
            True,
            id="clock-date-with-max-age",
        ),
        pytest.param(
            "expiring=x; expires=Thu, 01 Jan 2099 00:00:00 GMT; Path=/; SameSite=lax",
            "expiring=x; expires=Fri, 02 Jan 2099 00:00:00 GMT; Path=/; SameSite=lax",
            False,
            id="date-without-max-age",
        ),
        pytest.param(
            'gone="a"; expires=Thu, 26 Nov 2026 06:44:45 GMT; Max-Age=0; Path=/',
            'gone="b"; expires=Thu, 26 Nov 2026 06:44:45 GMT; Max-Age=0; Path=/',
            False,
            id="other-value",
        ),
        pytest.param(
            "expires=1; Max-Age=60; Path=/", "expires=2; Max-Age=60; Path=/", False, id="cookie-named-expires"
        ),
    ],
)
def test_set_cookie_dates_from_the_clock_are_compared_as_placeholders(
    first: str, second: str, same: bool
) -> None:
    assert (
        header_multiset([("Set-Cookie", first)], IGNORED_HEADERS)
        == header_multiset([("set-cookie", second)], IGNORED_HEADERS)
    ) is same
