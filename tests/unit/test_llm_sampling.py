"""How the transformers engine chooses a token (``engines/sampling.py``), in vLLM's order,
and how a request's sampling fields become a :class:`Sampling` (``protocol.py``): bounds
as vLLM's, each refusal a 400 naming its field."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from app_toolkit.llm import protocol, request_options
from app_toolkit.llm.engine import Sampling
from app_toolkit.llm.engines.sampling import bias, choose, hold_stops, logprobs_of, penalise
from app_toolkit.llm.errors import OpenAIError
from app_toolkit.llm.protocol import ChatCompletionRequest, CompletionRequest

MESSAGES: Any = [{"role": "user", "content": "hi"}]


def scores(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_logit_bias_adds_to_its_tokens_and_min_tokens_refuses_the_stops_until_reached() -> None:
    sampling = Sampling(max_tokens=8, logit_bias=((1, 2.5), (3, -1.0)), min_tokens=2)
    row = scores(0.0, 1.0, 2.0, 3.0)
    bias(row, sampling)
    hold_stops(row, sampling, generated=1, stops={0, 2})
    assert row.tolist() == [float("-inf"), 3.5, float("-inf"), 2.0]
    row = scores(0.0, 1.0, 2.0, 3.0)
    hold_stops(row, sampling, generated=2, stops={0, 2})  # min_tokens reached: the stops may come
    assert row.tolist() == [0.0, 1.0, 2.0, 3.0]
    # Where only stops are left (a grammar allowing nothing else), they stay, as in vLLM.
    row = scores(float("-inf"), 1.0, float("-inf"), float("-inf"))
    hold_stops(row, sampling, generated=0, stops={1})
    assert row.tolist()[1] == 1.0


def test_penalties_as_vllm_applies_them() -> None:
    sampling = Sampling(max_tokens=8, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    row = scores(4.0, -4.0, 1.0, 1.0)
    # Repetition over the prompt's and the reply's tokens (seen); frequency and presence over the reply's.
    penalise(row, sampling, seen={0, 1, 3}, reply=[3, 3, 0])
    assert row.tolist() == [2.0 - 0.5 - 0.25, -8.0, 1.0, 0.5 - 1.0 - 0.25]
    untouched = scores(4.0, -4.0)
    penalise(untouched, Sampling(max_tokens=8), seen={0, 1}, reply=[0])
    assert untouched.tolist() == [4.0, -4.0]


def test_greedy_takes_the_likeliest_whatever_the_cuts() -> None:
    row = scores(0.1, 3.0, 2.9)
    assert choose(row, Sampling(max_tokens=1, temperature=0, top_k=1, min_p=0.9, top_p=0.1), None) == 1


def test_scores_that_are_not_numbers_never_break_the_draw() -> None:
    generator = torch.Generator().manual_seed(1)
    tiny = Sampling(max_tokens=1, temperature=1e-9)  # below vLLM's 0.01: taken as 0.01
    assert choose(scores(1.0, float("nan"), 0.0), tiny, generator) == 0
    assert choose(scores(float("inf"), 0.0, float("inf")), Sampling(max_tokens=1), generator) in (0, 2)
    assert choose(scores(float("nan"), float("nan")), Sampling(max_tokens=1), generator) in (0, 1)


def test_top_k_min_p_and_top_p_cut_what_may_be_drawn() -> None:
    row = scores(2.0, 1.9, 1.8, 0.5, -1.0)
    generator = torch.Generator().manual_seed(7)

    def drawn(sampling: Sampling) -> set[int]:
        return {choose(row.clone(), sampling, generator) for _ in range(300)}

    assert drawn(Sampling(max_tokens=1)) == {0, 1, 2, 3, 4}
    assert drawn(Sampling(max_tokens=1, top_k=2)) == {0, 1}
    # min_p 0.5: tokens at least half as likely as the likeliest (e^-0.2 and e^-0.1 are, e^-1.5 is not).
    assert drawn(Sampling(max_tokens=1, min_p=0.5)) == {0, 1, 2}
    assert drawn(Sampling(max_tokens=1, top_p=0.3)) == {0}  # the likeliest alone holds 0.3 of the mass


def test_a_seeded_draw_repeats() -> None:
    row = scores(*([0.0] * 50))

    def draws(seed: int) -> list[int]:
        generator = torch.Generator().manual_seed(seed)
        return [choose(row.clone(), Sampling(max_tokens=1, top_k=20), generator) for _ in range(20)]

    assert draws(3) == draws(3) != draws(4)


def test_a_requests_sampling_fields_become_its_sampling() -> None:
    request = ChatCompletionRequest(
        messages=MESSAGES,
        max_tokens=20,
        temperature=0.5,
        top_k=-1,
        min_p=0.05,
        seed=4,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        logit_bias={"12": 300.0, "7": -5.0, "012": 1.0},  # "012" names 12 again: the last counts
        min_tokens=3,
        stop_token_ids=[9],
    ).checked()
    assert request.sampling(20, 1.0) == Sampling(
        max_tokens=20,
        temperature=0.5,
        top_k=0,  # vLLM's -1: no limit
        min_p=0.05,
        seed=4,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        logit_bias=((12, 1.0), (7, -5.0)),  # one bias a token, cut to ±100 as vLLM does
        min_tokens=3,
        stop_token_ids=(9,),
    )
    defaults = CompletionRequest(prompt="x").checked().sampling(16, 1.0)
    assert defaults == Sampling(max_tokens=16)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3),
        ("repetition_penalty", 0),
        ("repetition_penalty", float("inf")),
        ("top_k", -2),
        ("min_p", 1.5),
        ("min_tokens", -1),
        ("logit_bias", {str(token): 1.0 for token in range(protocol.MAX_LOGIT_BIAS + 1)}),
    ],
)
def test_values_out_of_vllms_bounds_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as refused:
        ChatCompletionRequest(messages=MESSAGES, **{field: value})
    assert refused.value.errors()[0]["loc"][0] == field


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logit_bias": {"twelve": 1.0}}, "logit_bias"),
        ({"logit_bias": {"-3": 1.0}}, "logit_bias"),
        ({"logit_bias": {"3": float("nan")}}, "logit_bias"),
        ({"min_tokens": 9, "max_tokens": 8}, "min_tokens"),
    ],
)
def test_bad_bias_keys_and_min_tokens_past_max_tokens_are_400s(fields: dict[str, Any], param: str) -> None:
    request = CompletionRequest(prompt="x", **fields).checked()
    with pytest.raises(OpenAIError) as refused:
        request.sampling(request.max_tokens, 1.0)
    assert (refused.value.status, refused.value.param) == (400, param)


def test_unknown_fields_are_ignored_and_logged_once_each(caplog: pytest.LogCaptureFixture) -> None:
    request_options._unknown_logged.discard("frobnicate")
    with caplog.at_level(logging.INFO, logger="app_toolkit.llm"):
        for _ in range(3):
            ChatCompletionRequest(messages=MESSAGES, frobnicate=1).checked()
            CompletionRequest(prompt="x", frobnicate=1).checked()
    said = [record.getMessage() for record in caplog.records if "frobnicate" in record.getMessage()]
    assert said == ["A request field this server does not know was ignored: frobnicate"]
    # Options this server cannot honour are still refused by name.
    with pytest.raises(OpenAIError) as refused:
        ChatCompletionRequest(messages=MESSAGES, functions=[{"name": "f"}]).checked()
    assert refused.value.param == "functions"
    # Rules that refuse the unknown (the chat template's) still do.
    rules = protocol.OptionRules(refused={}, ignored=frozenset())
    with pytest.raises(OpenAIError) as unknown:
        protocol.checked_options({"frobnicate": 1}, rules)
    assert unknown.value.code == "unknown_parameter"


def test_unknown_names_logged_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request_options, "_unknown_logged", set())
    for number in range(request_options.MAX_UNKNOWN_LOGGED + 10):
        protocol.checked_options({f"field{number}": 1}, protocol.CHAT_RULES)
    assert len(request_options._unknown_logged) == request_options.MAX_UNKNOWN_LOGGED


def test_logprobs_are_the_rows_log_softmax_with_the_likeliest_first() -> None:
    raw = torch.log_softmax(scores(1.0, 3.0, 2.0, 0.0), dim=-1)
    found = logprobs_of(raw, token=2, count=2)
    assert found.logprob == pytest.approx(float(raw[2]))
    assert [token for token, _ in found.top] == [1, 2]
    assert [value for _, value in found.top] == pytest.approx([float(raw[1]), float(raw[2])])
    assert logprobs_of(raw, token=0, count=0).top == ()
    assert len(logprobs_of(raw, token=0, count=20).top) == 4  # no more than the vocabulary


def test_logprobs_fields_become_the_samplings_count() -> None:
    chat = ChatCompletionRequest(messages=MESSAGES, logprobs=True, top_logprobs=3).checked()
    assert chat.sampling(None, 1.0).logprobs == 3
    assert ChatCompletionRequest(messages=MESSAGES, logprobs=True).checked().sampling(None, 1.0).logprobs == 0
    assert ChatCompletionRequest(messages=MESSAGES).checked().sampling(None, 1.0).logprobs is None
    assert (
        ChatCompletionRequest(messages=MESSAGES, logprobs=None).checked().sampling(None, 1.0).logprobs is None
    )
    with pytest.raises(OpenAIError) as alone:
        ChatCompletionRequest(messages=MESSAGES, top_logprobs=2).checked()
    assert alone.value.param == "top_logprobs"
    with pytest.raises(ValidationError):
        ChatCompletionRequest(messages=MESSAGES, logprobs=True, top_logprobs=21)
    assert CompletionRequest(prompt="x", logprobs=0).checked().sampling(16, 1.0).logprobs == 0
    with pytest.raises(OpenAIError) as echoed:
        CompletionRequest(prompt="x", logprobs=1, echo=True).checked()
    assert echoed.value.param == "logprobs"


def test_vllms_request_fields_not_honoured_are_refused_not_ignored() -> None:
    for field, value in (("prompt_logprobs", 1), ("bad_words", ["x"]), ("use_beam_search", True)):
        with pytest.raises(OpenAIError) as refused:
            CompletionRequest(prompt="x", **{field: value}).checked()
        assert refused.value.param == field
        CompletionRequest(prompt="x", **{field: None}).checked()  # "not used" is taken
    with pytest.raises(OpenAIError) as template:
        ChatCompletionRequest(messages=MESSAGES, continue_final_message=True).checked()
    assert template.value.param == "continue_final_message"


def test_n_choices_of_a_greedy_reply_are_refused_as_vllm_refuses_them() -> None:
    request = CompletionRequest(prompt="x", n=2, temperature=0).checked()
    with pytest.raises(OpenAIError) as refused:
        request.sampling(16, 1.0)
    assert refused.value.param == "n"
    assert CompletionRequest(prompt="x", n=2).checked().sampling(16, 1.0).temperature == 1.0
