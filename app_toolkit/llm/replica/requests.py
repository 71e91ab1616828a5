"""A request to a model's replica made into what its engine takes: the prompt's token ids
(a conversation through the chat template, a text encoded, ids checked) and the sampling
fitted to the context window, with the 400s, each naming its field, for what does not fit
or what the engine cannot give."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from app_toolkit.llm.engine import EmbeddingEngine, Sampling, TextEngine
from app_toolkit.llm.errors import OpenAIError, bad_parameter
from app_toolkit.llm.events import Generation
from app_toolkit.llm.openai_shapes import JSONObject
from app_toolkit.llm.protocol import text_content
from app_toolkit.llm.replica.shaping import checked_calls, prompt_messages, template_takes_tools


def check_sampling(engine: TextEngine, sampling: Sampling) -> None:
    """A 400 naming the field where ``sampling`` asks what ``engine`` cannot give
    (log-probabilities) or names a token id outside its vocabulary."""
    if sampling.logprobs is not None and not engine.capabilities.logprobs:
        raise bad_parameter("logprobs", f"The {engine.name} engine gives no log-probabilities.")
    if sampling.stop_token_ids:
        check_ids(engine, sampling.stop_token_ids, "stop_token_ids")
    if sampling.logit_bias:
        check_ids(engine, [token for token, _ in sampling.logit_bias], "logit_bias")


def prompt_ids(engine: TextEngine, generation: Generation, as_given: bool = False) -> list[int]:
    """The prompt's token ids. A conversation whose replies vLLM's parsers read goes to the
    chat template ``as_given``, with its tools, as vLLM renders it; otherwise, where the
    template shows no tools, they are described to the model (``prompt_messages``)."""
    if generation.messages:
        tools = list(generation.tools)
        shown = as_given or template_takes_tools(engine.tokenizer)
        texts = text_messages(generation.messages)
        checked_calls(texts)
        messages = texts if as_given else prompt_messages(texts, tools, shown)
        return templated(
            engine,
            messages,
            tools if shown and tools else None,
            generation.template_kwargs,
            add_generation_prompt=generation.add_generation_prompt,
            continue_final_message=generation.continue_final_message,
        )
    if isinstance(generation.prompt, str):
        return engine.encode(generation.prompt)
    prompt = list(generation.prompt or ())
    check_ids(engine, prompt, "prompt")
    return prompt


def fitted(engine: TextEngine, generation: Generation, prompt_tokens: int) -> Sampling:
    """The sampling with ``max_tokens`` cut to what the context window leaves; a prompt
    that leaves nothing, or a ``max_tokens`` asked for beyond it, is a 400."""
    window = engine.context_window
    param = "messages" if generation.messages else "prompt"
    requested = generation.sampling.max_tokens
    if generation.max_tokens_given and requested > window:  # whatever the prompt, as vLLM says
        raise bad_parameter(
            "max_tokens",
            f"max_tokens={requested} cannot be greater than max_model_len={window}. "
            "Please request fewer output tokens.",
        )
    if prompt_tokens >= window or (generation.max_tokens_given and prompt_tokens + requested > window):
        asked = f" and {requested} for the reply" if generation.max_tokens_given else ""
        raise OpenAIError(
            400,
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{prompt_tokens + (requested if generation.max_tokens_given else 0)} tokens "
            f"({prompt_tokens} in the {param}{asked}). Shorten the {param} or lower max_tokens.",
            "invalid_request_error",
            "context_length_exceeded",
            param,
        )
    room = window - prompt_tokens
    if generation.sampling.min_tokens > min(room, requested):
        raise bad_parameter(
            "min_tokens",
            f"min_tokens must be less than or equal to the {min(room, requested)} tokens the reply "
            f"may take, got {generation.sampling.min_tokens}.",
        )
    if requested <= room:
        return generation.sampling
    return dataclasses.replace(generation.sampling, max_tokens=room)


def templated(
    engine: TextEngine,
    messages: Sequence[Mapping[str, object]],
    tools: Sequence[Mapping[str, object]] | None = None,
    template_kwargs: Mapping[str, object] | None = None,
    *,
    add_generation_prompt: bool,
    continue_final_message: bool,
) -> list[int]:
    """The conversation through the engine's chat template. What the template refuses (its
    own checks, such as the order of roles; a last message it cannot leave open) is a 400
    naming ``messages``, or ``continue_final_message`` for the latter, as vLLM answers."""
    try:
        return engine.chat_prompt(
            messages,
            tools,
            template_kwargs,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )
    except ValueError as exc:
        prefill = continue_final_message and "final message" in str(exc)
        raise bad_parameter("continue_final_message" if prefill else "messages", str(exc)) from None


def text_messages(messages: Sequence[Mapping[str, object]]) -> list[JSONObject]:
    """OpenAI messages with their content as text (parts joined); other part types refused."""
    return [
        {**message, "content": text_content(message["content"], f"messages[{index}].content")}
        if isinstance(message.get("content"), list)
        else dict(message)
        for index, message in enumerate(messages)
    ]


def check_ids(engine: TextEngine | EmbeddingEngine, tokens: Sequence[int], param: str) -> None:
    """A 400 naming ``param`` when a token id is outside the model's vocabulary."""
    size = engine.vocab_size
    if any(not 0 <= token < size for token in tokens):
        raise bad_parameter(param, f"This model's token ids run from 0 to {size - 1}.")
