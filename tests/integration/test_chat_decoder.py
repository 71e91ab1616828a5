"""The chat example's continuous-batching decoder, on a tiny randomly initialised Llama
(no weights to load): decoding replies together gives exactly the tokens decoding each
alone gives, replies join and leave mid-flight, and a reader that leaves frees its row."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from examples.chat.chat.engines import decoder as decoder_module
from examples.chat.chat.engines.decoder import Decoder
from examples.chat.chat.scaling import EngineLoad
from tests.waiting import wait_for_async

EOS = 1
PROMPTS = [[5, 9, 12], [7, 3, 3, 8, 20, 41, 2], [30], [11, 12, 13, 14, 15]]


@pytest.fixture(scope="module")
def model() -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=EOS,
    )
    return LlamaForCausalLM(config).eval()  # type: ignore[no-untyped-call]  # transformers: unannotated


async def reply(decoder: Decoder, prompt: list[int], max_tokens: int = 12) -> list[int]:
    return [token async for token in decoder.generate(prompt, max_tokens, temperature=0)]


def test_batched_replies_equal_replies_decoded_alone(model: Any) -> None:
    async def scenario() -> None:
        alone = Decoder(model, {EOS}, max_batch_size=1, repetition_penalty=1.0)
        together = Decoder(model, {EOS}, max_batch_size=4, repetition_penalty=1.0)
        try:
            expected = [await reply(alone, prompt) for prompt in PROMPTS]
            # All at once, and staggered: later replies join a batch already decoding.
            assert await asyncio.gather(*(reply(together, prompt) for prompt in PROMPTS)) == expected

            async def late(index: int) -> list[int]:
                await asyncio.sleep(0.01 * index)
                return await reply(together, PROMPTS[index])

            assert await asyncio.gather(*(late(index) for index in range(len(PROMPTS)))) == expected
            assert together.active == 0
        finally:
            await alone.close()
            await together.close()

    asyncio.run(scenario())


def test_a_reader_that_leaves_frees_its_row(model: Any) -> None:
    async def scenario() -> None:
        decoder = Decoder(model, set(), max_batch_size=2, repetition_penalty=1.1)  # no EOS: runs to max
        alone = Decoder(model, set(), max_batch_size=1, repetition_penalty=1.1)
        try:
            expected = await reply(alone, PROMPTS[1], max_tokens=300)
            long_reply = decoder.generate(PROMPTS[0], 10_000, temperature=0)
            assert isinstance(long_reply, AsyncGenerator)  # an async generator function's: it has aclose()
            await anext(long_reply)
            other = asyncio.ensure_future(reply(decoder, PROMPTS[1], max_tokens=300))
            await wait_for_async(lambda: decoder.active == 2, timeout_s=10)
            await long_reply.aclose()  # the reader leaves mid-reply
            assert await other == expected  # the other reply is unaffected
            await wait_for_async(lambda: decoder.active == 0, timeout_s=10)
            produced = decoder.tokens
            await asyncio.sleep(0.2)
            assert decoder.tokens == produced  # nothing decodes for the abandoned reply
            # And a third reply gets the freed row.
            assert len(await reply(decoder, PROMPTS[2], max_tokens=3)) == 3
        finally:
            await decoder.close()
            await alone.close()

    asyncio.run(scenario())


def test_the_load_it_reports_counts_slots_remaining_tokens_and_the_queue(model: Any) -> None:
    """What the model pool's autoscaling sees (examples/chat/chat/scaling.py)."""

    async def scenario() -> None:
        decoder = Decoder(model, set(), max_batch_size=2, repetition_penalty=1.0)  # no EOS: runs to max
        try:
            assert decoder.current_load() == EngineLoad(slots=2)
            busy = [decoder.generate(prompt, 1000, temperature=0) for prompt in PROMPTS[:2]]
            for stream in busy:
                await anext(stream)
            queued = asyncio.ensure_future(reply(decoder, PROMPTS[3], max_tokens=50))
            await wait_for_async(lambda: decoder.active == 3 and decoder.step_s > 0, timeout_s=10)
            load = decoder.current_load()  # no await since: nothing decoded meanwhile
            assert load.slots == 2 and load.queued == ((len(PROMPTS[3]), 50),) and load.step_s > 0
            assert len(load.running) == 2 and sum(load.running) == 2 * 1000 - decoder.tokens
            for stream in busy:
                assert isinstance(stream, AsyncGenerator)  # an async generator function's: it has aclose()
                await stream.aclose()
            assert len(await queued) == 50
            await wait_for_async(lambda: decoder.active == 0, timeout_s=10)
            assert decoder.current_load().running == () and decoder.current_load().queued == ()
        finally:
            await decoder.close()

    asyncio.run(scenario())


def test_a_long_prompt_read_in_chunks_gives_the_tokens_of_one_pass_and_a_cancelled_one_queues_nothing(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    long_prompt = [(7 * index) % 60 + 2 for index in range(100)]  # 100 tokens: two chunks of 64

    async def scenario() -> None:
        decoder = Decoder(model, {EOS}, max_batch_size=2, repetition_penalty=1.0)
        try:
            chunked = await reply(decoder, long_prompt)
            monkeypatch.setattr(decoder_module, "PREFILL_CHUNK", 10_000)  # the whole prompt in one pass
            assert await reply(decoder, long_prompt) == chunked
            monkeypatch.setattr(decoder_module, "PREFILL_CHUNK", 64)

            # The batch is full; a third reply waits in the queue and its reader leaves.
            busy = [decoder.generate(prompt, 10_000, temperature=0) for prompt in PROMPTS[:2]]
            for stream in busy:
                await anext(stream)
            queued = asyncio.ensure_future(reply(decoder, PROMPTS[2]))
            await wait_for_async(lambda: decoder.active == 3, timeout_s=10)
            queued.cancel()
            await asyncio.sleep(0)  # the cancellation runs; nothing waits for a decoding step
            assert decoder.active == 2
            for stream in busy:
                assert isinstance(stream, AsyncGenerator)  # an async generator function's: it has aclose()
                await stream.aclose()
            await wait_for_async(lambda: decoder.active == 0, timeout_s=10)
        finally:
            await decoder.close()

    asyncio.run(scenario())


def test_a_pass_stopped_between_layers_for_a_leaving_reader_is_redone_without_its_row(model: Any) -> None:
    async def scenario() -> None:
        decoder = Decoder(model, set(), max_batch_size=2, repetition_penalty=1.1)
        alone = Decoder(model, set(), max_batch_size=1, repetition_penalty=1.1)
        hook = None
        try:
            expected = await reply(alone, PROMPTS[1], max_tokens=40)
            leaving = decoder.generate(PROMPTS[0], 10_000, temperature=0)
            assert isinstance(leaving, AsyncGenerator)  # an async generator function's: it has aclose()
            await anext(leaving)
            other = asyncio.ensure_future(reply(decoder, PROMPTS[1], max_tokens=40))
            await wait_for_async(lambda: decoder.active == 2, timeout_s=10)
            passes = 0

            def leave_inside_a_pass(module: Any, args: Any) -> None:
                nonlocal passes
                passes += 1
                if passes == 5 and len(decoder._active) == 2:
                    decoder._active[0].abandoned = True  # as its reader leaving does, mid-pass

            # After the decoder's own check on the first layer: that layer runs and stores its
            # new position in the cache, then the second layer's check stops the pass.
            hook = model.model.layers[0].register_forward_pre_hook(leave_inside_a_pass)
            assert await other == expected  # the other row's cache was cut back exactly
            assert passes > 5 and decoder.active == 0
            await leaving.aclose()
        finally:
            if hook is not None:
                hook.remove()
            await decoder.close()
            await alone.close()

    asyncio.run(scenario())
