"""OpenAI's error answers: the shape, the status, and when a retry may succeed."""

from __future__ import annotations

import json
import pickle

import pytest

from app_toolkit.exceptions import BackPressureError
from app_toolkit.llm.errors import OpenAIError, answer, as_openai_error, invalid_request


@pytest.mark.parametrize(
    ("error", "retry_after"),
    [
        (OpenAIError(429, "Slow down.", "requests", "rate_limit_exceeded", retry_after=2.2), "3"),
        (OpenAIError(429, "Slow down.", "requests", "rate_limit_exceeded", retry_after=0.001), "1"),
        (OpenAIError(503, "Busy.", "server_error", "overloaded"), "1"),
        (OpenAIError(400, "Bad.", param="messages"), None),
    ],
)
def test_an_answer_says_when_to_retry(error: OpenAIError, retry_after: str | None) -> None:
    sent = answer(error)
    assert sent.status_code == error.status
    assert sent.headers.get("Retry-After") == retry_after
    assert json.loads(bytes(sent.body))["error"] == {
        "message": error.message,
        "type": error.type,
        "param": error.param,
        "code": error.code,
    }


def test_every_field_crosses_processes() -> None:
    error = OpenAIError(429, "Slow down.", "requests", "rate_limit_exceeded", "model", retry_after=1.5)
    back = pickle.loads(pickle.dumps(error))
    assert vars(back) == vars(error)
    # Rebuilt from its args alone, as an exception crossing processes may be.
    assert error.args == (429, "Slow down.", "requests", "rate_limit_exceeded", "model", 1.5)
    assert vars(OpenAIError(*error.args)) == vars(error)


def test_a_failed_validation_names_the_first_field_at_fault() -> None:
    error = invalid_request(
        [
            {"loc": ("body", "messages", 0, "content"), "msg": "Field required"},
            {"loc": ("body", "top_p"), "msg": "Input should be greater than 0"},
        ]
    )
    assert (error.status, error.param, error.code) == (400, "messages[0].content", "invalid_request")
    assert error.message == (
        "Invalid request: messages[0].content: Field required; top_p: Input should be greater than 0"
    )


def test_a_deployments_backpressure_answer_keeps_its_status_and_retry_after() -> None:
    limited = as_openai_error(BackPressureError("LLMServer-m", 10, status_code=429, retry_after_s=7.0))
    assert (limited.status, limited.code, limited.retry_after) == (429, "rate_limit_exceeded", 7.0)
    busy = as_openai_error(BackPressureError("LLMServer-m", 10))
    assert (busy.status, busy.code, busy.retry_after) == (503, "overloaded", 1.0)
