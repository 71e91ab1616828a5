"""The transformers engine's continuous-batching decoder, on a tiny randomly initialised
Llama (no weights to load): decoding replies together gives exactly the tokens decoding
each alone gives, replies join and leave mid-flight, a reader that leaves frees its row,
and each reply samples on its own terms (seed, stop tokens, a constraint)."""

from __future__ import annotations

import asyncio
import dataclasses
import warnings
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from app_toolkit.llm.engine import EngineLoad, EngineRequest, EngineStopped, Sampling
from app_toolkit.llm.engines import forward_passes
from app_toolkit.llm.engines.decoder import Decoder, DecoderHooks
from app_toolkit.llm.engines.prefix_cache import PrefixCache
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


def greedy(max_tokens: int) -> Sampling:
    return Sampling(max_tokens=max_tokens, temperature=0)


async def reply(decoder: Decoder, prompt: list[int], max_tokens: int = 12) -> list[int]:
    return [
        token.id
        async for token in decoder.generate(EngineRequest(prompt, greedy(max_tokens)))
        if not token.ends
    ]


def test_batched_replies_equal_replies_decoded_alone(model: Any) -> None:
    async def scenario() -> None:
        alone = Decoder(model, {EOS}, max_batch_size=1)
        together = Decoder(model, {EOS}, max_batch_size=4)
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
        decoder = Decoder(model, set(), max_batch_size=2)  # no EOS: runs to max
        alone = Decoder(model, set(), max_batch_size=1)
        try:
            expected = await reply(alone, PROMPTS[1], max_tokens=300)
            long_reply = decoder.generate(EngineRequest(PROMPTS[0], greedy(10_000)))
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


def test_a_decoder_whose_loop_ended_by_a_fault_fails_its_health_check(
    model: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from app_toolkit.llm.engines.adapters import read
    from tests.lora_models import peft_adapter

    peft_adapter(model, tmp_path / "late", 3)

    async def scenario() -> None:
        decoder = Decoder(model, {EOS}, max_batch_size=1)
        try:
            assert len(await reply(decoder, PROMPTS[0], max_tokens=2)) == 2
            decoder.check_health()  # its loop waits for work: healthy

            def fault() -> None:
                raise MemoryError("a fault outside a pass")

            monkeypatch.setattr(decoder, "_drop_finished", fault)  # the loop's first step
            waiting = asyncio.ensure_future(reply(decoder, PROMPTS[1], max_tokens=2))

            async def unhealthy() -> RuntimeError | None:
                try:
                    decoder.check_health()
                except RuntimeError as exc:
                    return exc
                return None

            failed = await wait_for_async(unhealthy, timeout_s=10, what="the health check failing")
            assert "loop has ended" in str(failed) and isinstance(failed.__cause__, MemoryError)
            # The reply it held ends, rather than waiting for a loop that is gone, and so
            # does one asked now: the engine is dead (EngineStopped: elsewhere, retried).
            with pytest.raises(EngineStopped):
                await asyncio.wait_for(waiting, timeout=10)
            with pytest.raises(EngineStopped):
                await reply(decoder, PROMPTS[2], max_tokens=2)
            with pytest.raises(EngineStopped):  # nor does an adapter's attach wait for it
                await asyncio.wait_for(decoder.attach(read(tmp_path, "late", max_rank=16)), timeout=10)
        finally:
            await decoder.close()

    asyncio.run(scenario())


def test_the_replies_open_at_the_close_end_with_engine_stopped(model: Any) -> None:
    """A reply decoding and one queued behind it when the decoder closes (its replica ends
    past the drain's deadline) each end with EngineStopped, which the model's server
    answers as a 503, rather than waiting for tokens that never come; a reply asked
    after the close is refused with it."""

    async def scenario() -> None:
        decoder = Decoder(model, set(), max_batch_size=1)  # no EOS: the first runs to max
        running = decoder.generate(EngineRequest(PROMPTS[0], greedy(10_000)))
        await anext(running)
        queued = asyncio.ensure_future(reply(decoder, PROMPTS[1], max_tokens=4))
        await wait_for_async(lambda: decoder.current_load().waiting == 1, timeout_s=10)
        await decoder.close()
        with pytest.raises(EngineStopped):
            async for _ in running:
                pass
        with pytest.raises(EngineStopped):
            await asyncio.wait_for(queued, timeout=10)  # the bound: a reply left waiting hangs
        with pytest.raises(EngineStopped):
            await reply(decoder, PROMPTS[2], max_tokens=2)

    asyncio.run(scenario())


def test_its_queue_serves_a_lower_priority_class_first(model: Any) -> None:
    """Replies waiting for a slot leave the queue by priority class (lower first, vLLM's
    order), in arrival order within one."""

    async def scenario() -> None:
        decoder = Decoder(model, set(), max_batch_size=1)  # no EOS: the first runs to max
        running = decoder.generate(EngineRequest(PROMPTS[0], greedy(10_000)))
        await anext(running)
        started: list[str] = []

        async def queued(name: str, priority: int) -> None:
            request = EngineRequest(
                PROMPTS[1], greedy(2), priority=priority, on_slot=lambda: started.append(name)
            )
            async for _ in decoder.generate(request):
                pass

        def waiting(count: int) -> Callable[[], bool]:
            return lambda: decoder.current_load().waiting == count

        tasks = []
        for name, priority in (("low", 2), ("plain", 0), ("high", -1), ("plain2", 0)):
            tasks.append(asyncio.ensure_future(queued(name, priority)))
            await wait_for_async(waiting(len(tasks)), timeout_s=10)
        await running.aclose()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        assert started == ["high", "plain", "plain2", "low"]
        await decoder.close()

    asyncio.run(scenario())


def test_an_attach_waiting_at_the_close_ends_with_engine_stopped(model: Any, tmp_path: Any) -> None:
    """A LoRA adapter waiting to be attached between two passes when the decoder closes
    (its request loading it) ends with EngineStopped, rather than waiting for a loop that
    is gone; an attach asked after the close is refused with it."""
    from app_toolkit.llm.engines.adapters import read
    from tests.lora_models import peft_adapter

    peft_adapter(model, tmp_path / "late", 3)
    files = read(tmp_path, "late", max_rank=16)

    async def scenario() -> None:
        served = type(model)(model.config)
        served.load_state_dict(model.state_dict())
        decoder = Decoder(served.eval(), set(), max_batch_size=1)  # no EOS: the reply runs on
        running = decoder.generate(EngineRequest(PROMPTS[0], greedy(10_000)))
        await anext(running)
        attaching = asyncio.ensure_future(decoder.attach(files))
        await asyncio.sleep(0)  # listed: it waits for the moment between two passes
        await decoder.close()
        with pytest.raises(EngineStopped):
            await asyncio.wait_for(attaching, timeout=10)  # the bound: an attach left waiting hangs
        with pytest.raises(EngineStopped):
            await decoder.attach(files)
        with pytest.raises(EngineStopped):
            await anext(running)

    asyncio.run(scenario())


def test_the_load_it_reports_counts_slots_remaining_tokens_and_the_queue(model: Any) -> None:
    """What a model pool's autoscaling sees (examples/chat/chat/scaling.py)."""

    async def scenario() -> None:
        decoder = Decoder(model, set(), max_batch_size=2)  # no EOS: runs to max
        try:
            assert decoder.current_load() == EngineLoad.of(2, ())
            busy = [decoder.generate(EngineRequest(prompt, greedy(1000))) for prompt in PROMPTS[:2]]
            for stream in busy:
                await anext(stream)
            queued = asyncio.ensure_future(reply(decoder, PROMPTS[3], max_tokens=50))
            await wait_for_async(lambda: decoder.active == 3 and decoder.step_s > 0, timeout_s=10)
            load = decoder.current_load()  # no await since: nothing decoded meanwhile
            assert load.slots == 2 and load.queued == ((len(PROMPTS[3]), 50),) and load.step_s > 0
            assert load.remaining is not None and load.running == 2 and load.waiting == 1
            assert sum(load.remaining) == 2 * 1000 - decoder.tokens
            for stream in busy:
                assert isinstance(stream, AsyncGenerator)  # an async generator function's: it has aclose()
                await stream.aclose()
            assert len(await queued) == 50
            await wait_for_async(lambda: decoder.active == 0, timeout_s=10)
            assert decoder.current_load() == EngineLoad.of(2, (), step_s=decoder.step_s)
        finally:
            await decoder.close()

    asyncio.run(scenario())


def test_a_long_prompt_read_in_chunks_gives_the_tokens_of_one_pass_and_a_cancelled_one_queues_nothing(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    long_prompt = [(7 * index) % 60 + 2 for index in range(100)]  # 100 tokens: two chunks of 64

    async def scenario() -> None:
        decoder = Decoder(model, {EOS}, max_batch_size=2)
        try:
            chunked = await reply(decoder, long_prompt)
            monkeypatch.setattr(forward_passes, "PREFILL_CHUNK", 10_000)  # the whole prompt in one pass
            assert await reply(decoder, long_prompt) == chunked
            monkeypatch.setattr(forward_passes, "PREFILL_CHUNK", 64)

            # The batch is full; a third reply waits in the queue and its reader leaves.
            busy = [decoder.generate(EngineRequest(prompt, greedy(10_000))) for prompt in PROMPTS[:2]]
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
        decoder = Decoder(model, set(), max_batch_size=2)
        alone = Decoder(model, set(), max_batch_size=1)
        hook = None
        try:
            expected = await reply(alone, PROMPTS[1], max_tokens=40)
            leaving = decoder.generate(EngineRequest(PROMPTS[0], greedy(10_000)))
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


class Only:
    """A toy constraint: only ``tokens`` may come; finished after ``length`` of them."""

    grammar = ""  # no text: the decoder reads allowed()

    def __init__(self, tokens: set[int], length: int) -> None:
        self.tokens, self.length = tokens, length
        self.asked: list[int] = []
        self.accepted: list[int] = []

    def allowed(self, vocab_size: int) -> torch.Tensor:
        self.asked.append(vocab_size)
        mask = torch.zeros(vocab_size - 3, dtype=torch.bool)  # shorter than the row: the rest refused
        mask[sorted(self.tokens)] = True
        return mask

    def accept(self, token_id: int) -> None:
        self.accepted.append(token_id)

    @property
    def finished(self) -> bool:
        return len(self.accepted) >= self.length


def test_each_reply_samples_on_its_own_terms(model: Any) -> None:
    async def scenario() -> None:
        decoder = Decoder(model, {EOS}, max_batch_size=4)

        async def sampled(prompt: list[int], sampling: Sampling, constraint: Any = None) -> list[int]:
            return [
                t.id
                async for t in decoder.generate(EngineRequest(prompt, sampling, constraint))
                if not t.ends
            ]

        try:
            seeded = Sampling(max_tokens=30, temperature=1.5, seed=7, ignore_eos=True)
            first, again, other = await asyncio.gather(
                sampled(PROMPTS[1], seeded),
                sampled(PROMPTS[1], seeded),
                sampled(PROMPTS[1], Sampling(max_tokens=30, temperature=1.5, seed=8, ignore_eos=True)),
            )
            assert first == again and len(first) == 30  # the same seed, the same reply (batched)
            assert first != other  # the seed matters: a reply drawn at this temperature is not greedy

            plain = await sampled(PROMPTS[0], Sampling(max_tokens=20, temperature=0, ignore_eos=True))
            stop = plain[5]
            cut = await sampled(PROMPTS[0], Sampling(max_tokens=20, temperature=0, stop_token_ids=(stop,)))
            assert cut == plain[: plain.index(stop)]  # the stop token ends it, unsent

            only = Only({20, 30, 40}, length=4)
            constrained = await sampled(PROMPTS[2], Sampling(max_tokens=50, temperature=1.0, seed=1), only)
            assert len(constrained) == 4 and set(constrained) <= {20, 30, 40}  # finished ends it
            assert only.accepted == constrained and set(only.asked) == {64}  # asked for the row's width
            assert await sampled(PROMPTS[2], greedy(5), Only(set(), length=1)) == []  # nothing allowed
            assert decoder.active == 0
        finally:
            await decoder.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("cached", [True, False], ids=["prefix-cache", "no-cache"])
def test_a_continued_reply_goes_on_exactly_as_the_whole_reply_did(model: Any, cached: bool) -> None:
    """A reply carried over from a lost replica (``produced``) reads its tokens after the
    prompt and counts them as its own: with penalties and min_tokens, greedy, the rest is
    the whole reply's rest; read as prompt instead, the penalties would see other tokens.
    Its prompt's cached tokens, as reported, are its prompt's only."""
    sampling = Sampling(
        max_tokens=16,
        temperature=0,
        presence_penalty=1.5,
        frequency_penalty=0.5,
        repetition_penalty=1.3,
        min_tokens=12,
    )

    async def scenario() -> None:
        prefixes = PrefixCache(max_bytes=1 << 24) if cached else None
        decoder = Decoder(model, {EOS}, max_batch_size=2, prefix_cache=prefixes)

        async def sampled(request: EngineRequest) -> list[int]:
            return [t.id async for t in decoder.generate(request) if not t.ends]

        try:
            prompt = PROMPTS[1]
            whole = await sampled(EngineRequest(prompt, sampling))
            assert len(whole) >= 12
            for cut in (1, 6, len(whole) - 1):
                reported: list[int] = []
                produced = tuple(whole[:cut])
                continued = EngineRequest(prompt, sampling, on_prompt=reported.append, produced=produced)
                rest = await sampled(continued)
                assert rest == whole[cut:], cut
                assert reported == ([len(prompt)] if cached else [0]), cut
            assert await sampled(EngineRequest(prompt, sampling, produced=tuple(whole) + (5,) * 4)) == []
            # A negative presence penalty favours the reply's own tokens: the carried ones
            # count (the rest repeats them), where read as the prompt they would not.
            echoing = Sampling(max_tokens=12, temperature=0, presence_penalty=-2.0)
            whole = await sampled(EngineRequest(prompt, echoing))
            rest = await sampled(EngineRequest(prompt, echoing, produced=tuple(whole[:4])))
            naive = await sampled(
                EngineRequest(prompt + whole[:4], dataclasses.replace(echoing, max_tokens=8))
            )
            assert rest == whole[4:] and naive != rest
            only = Only({20, 30, 40, 50}, length=8)
            free = Sampling(max_tokens=50, temperature=0, presence_penalty=1.0)
            constrained = await sampled(EngineRequest(PROMPTS[2], free, only))
            carried = Only({20, 30, 40, 50}, length=8)
            for token in constrained[:3]:
                carried.accept(token)  # the caller's grammar has read the carried tokens
            rest = await sampled(EngineRequest(PROMPTS[2], free, carried, produced=tuple(constrained[:3])))
            assert rest == constrained[3:] and carried.accepted == constrained
            # Seeded sampling: the continued reply's random numbers skip the draws its
            # tokens so far took, so it draws the rest as the unbroken reply did.
            seeded = Sampling(max_tokens=16, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
            whole = await sampled(EngineRequest(prompt, seeded))
            assert len(whole) == 16
            for cut in (1, 9, 15):
                rest = await sampled(EngineRequest(prompt, seeded, produced=tuple(whole[:cut])))
                assert rest == whole[cut:], cut
            assert decoder.active == 0
        finally:
            await decoder.close()

    asyncio.run(scenario())


class Failing(Only):
    """A constraint whose check fails at its third token."""

    def accept(self, token_id: int) -> None:
        if len(self.accepted) == 2:
            raise ValueError("the grammar broke")
        super().accept(token_id)


def test_a_reply_whose_token_cannot_be_chosen_ends_alone(model: Any) -> None:
    """A failure choosing one row's token (its grammar, its numbers) ends that reply with
    the error; the replies decoded with it go on. min_tokens never leaves a grammar nothing."""

    async def scenario() -> None:
        decoder = Decoder(model, {EOS}, max_batch_size=4)
        try:
            expected = await reply(decoder, PROMPTS[1], max_tokens=12)
            broken = decoder.generate(EngineRequest(PROMPTS[0], greedy(20), Failing({20, 30}, length=10)))
            others = asyncio.ensure_future(reply(decoder, PROMPTS[1], max_tokens=12))
            with pytest.raises(RuntimeError, match="failed while decoding") as failed:
                async for _ in broken:
                    pass
            assert isinstance(failed.value.__cause__, ValueError)
            assert await others == expected
            # A grammar allowing only the end of sequence: min_tokens gives way, the reply ends.
            only_end = Only({EOS}, length=5)
            held = Sampling(max_tokens=8, temperature=0, min_tokens=3)
            ended = [t async for t in decoder.generate(EngineRequest(PROMPTS[2], held, only_end))]
            assert [(t.id, t.ends) for t in ended] == [(EOS, True)]
            unsure = Sampling(
                max_tokens=4, temperature=0.7, seed=3, repetition_penalty=1e-40
            )  # scores overflow
            assert len([t async for t in decoder.generate(EngineRequest(PROMPTS[2], unsure))]) <= 4
            assert decoder.active == 0
        finally:
            await decoder.close()

    asyncio.run(scenario())


def test_the_hooks_hear_of_admissions_steps_and_early_cancellations(model: Any) -> None:
    heard: list[tuple[str, object]] = []

    class Hooks(DecoderHooks):
        def admitted(self, waited_s: float) -> None:
            heard.append(("admitted", waited_s >= 0))

        def stepped(self, batch_size: int, took_s: float) -> None:
            heard.append(("stepped", batch_size))
            raise RuntimeError("a failing hook is logged, never breaks decoding")

        def cancelled(self, stage: str) -> None:
            heard.append(("cancelled", stage))

    async def scenario() -> None:
        decoder = Decoder(model, set(), max_batch_size=1, hooks=Hooks())
        try:
            busy = decoder.generate(EngineRequest(PROMPTS[0], greedy(10_000)))
            assert isinstance(busy, AsyncGenerator)  # an async generator function's: it has aclose()
            await anext(busy)
            queued = asyncio.ensure_future(reply(decoder, PROMPTS[1]))
            await wait_for_async(lambda: decoder.active == 2, timeout_s=10)
            queued.cancel()
            await asyncio.sleep(0)
            await busy.aclose()
            assert len(await reply(decoder, PROMPTS[2], max_tokens=3)) == 3
        finally:
            await decoder.close()

    asyncio.run(scenario())
    assert heard[0] == ("admitted", True) and ("cancelled", "queued") in heard
    assert ("stepped", 1) in heard and heard.count(("admitted", True)) == 2


def test_a_prompt_that_starts_like_a_sequence_read_before_reads_only_the_rest(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forward_passes, "PREFILL_CHUNK", 4)  # the rest is read in chunks too

    async def scenario() -> None:
        plain = Decoder(model, set(), max_batch_size=3)  # no EOS: to max_tokens
        prefixes = PrefixCache(max_bytes=1 << 24)
        cached = Decoder(model, set(), max_batch_size=3, prefix_cache=prefixes)
        reads: list[int] = []

        async def answer(decoder: Decoder, prompt: list[int], note: bool = False) -> list[int]:
            tokens = decoder.generate(
                EngineRequest(prompt, greedy(6), on_prompt=reads.append if note else None)
            )
            return [token.id async for token in tokens]

        try:
            first = PROMPTS[1]
            said = await answer(cached, first, note=True)
            assert said == await answer(plain, first) and reads == [0]
            # The next turn: the conversation so far and a new message. The ended reply's
            # prompt and tokens are cached, less its last token (sent, never read back).
            turn = first + said + [40, 41, 42, 43, 44]
            assert await answer(cached, turn, note=True) == await answer(plain, turn)
            assert reads[1] == len(first) + len(said) - 1
            # Replies sharing a prefix in one batch, each as the plain decoder gives it.
            fork = [first + [50, 51], first + [52], first[:3] + [9, 9, 9, 9, 9]]
            together = await asyncio.gather(*(answer(cached, prompt, note=True) for prompt in fork))
            assert together == [await answer(plain, prompt) for prompt in fork]
            assert sorted(reads[2:]) == [3, len(first), len(first)]
            assert prefixes.hit == sum(reads) and prefixes.queried == sum(map(len, [first, turn, *fork]))
        finally:
            await plain.close()
            await cached.close()

    asyncio.run(scenario())


def test_a_request_that_comes_while_the_idle_decoder_keeps_ended_replies_is_served(model: Any) -> None:
    # Idle with ended replies to keep, the decoder copies them into the prefix cache in its
    # thread; a request that arrives meanwhile must wake it (its wake-up was once cleared).
    async def scenario() -> None:
        decoder = Decoder(model, set(), max_batch_size=2, prefix_cache=PrefixCache(max_bytes=1 << 24))
        try:
            for turn in range(12):
                said = await asyncio.wait_for(reply(decoder, PROMPTS[turn % len(PROMPTS)], 4), 20)
                assert said
        finally:
            await decoder.close()

    asyncio.run(scenario())


def _greedy_by_peft(
    peft_model: Any, prompts: list[list[int]], names: list[str], max_tokens: int
) -> list[list[int]]:
    """peft's own greedy decoding of equal-length prompts in one batch, each row with its
    adapter (``adapter_names``), every step a full forward pass: the reference."""
    rows = torch.tensor(prompts)
    produced: list[list[int]] = [[] for _ in prompts]
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = peft_model(input_ids=rows, adapter_names=names).logits[:, -1]
            chosen = logits.argmax(dim=-1)
            for row, token in enumerate(chosen.tolist()):
                produced[row].append(token)
            rows = torch.cat([rows, chosen[:, None]], dim=1)
    return produced


def test_lora_replies_equal_peft_alone_and_in_a_mixed_batch(model: Any, tmp_path: Any) -> None:
    from peft import PeftModel

    from app_toolkit.llm.engines.adapters import GRADIENT_CHECKPOINTING, read
    from tests.lora_models import peft_adapter

    for name, seed in (("first", 1), ("second", 2)):
        peft_adapter(model, tmp_path / name, seed)
    reference_model = type(model)(model.config)
    reference_model.load_state_dict(model.state_dict())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", GRADIENT_CHECKPOINTING, FutureWarning)
        reference = PeftModel.from_pretrained(
            reference_model.eval(), str(tmp_path / "first"), adapter_name="first"
        )
        reference.load_adapter(str(tmp_path / "second"), adapter_name="second")
    reference.eval()
    prompts = [[5, 9, 12, 7], [30, 2, 8, 41], [11, 12, 13, 14]]
    names = ["first", "second", "__base__"]
    expected = _greedy_by_peft(reference, prompts, names, max_tokens=8)
    assert expected[0] != expected[2] and expected[1] != expected[2]  # the adapters change the replies

    async def scenario() -> None:
        served = type(model)(model.config)
        served.load_state_dict(model.state_dict())
        decoder = Decoder(served.eval(), set(), max_batch_size=3)
        try:
            plain = await reply(decoder, prompts[2], max_tokens=8)  # before any adapter
            for name in ("first", "second"):
                await decoder.attach(read(tmp_path, name, max_rank=16))
            alone = [
                [
                    t.id
                    async for t in decoder.generate(
                        EngineRequest(prompt, greedy(8), adapter=name if name != "__base__" else "")
                    )
                ]
                for prompt, name in zip(prompts, names, strict=True)
            ]
            assert alone == expected and plain == expected[2]

            async def one(prompt: list[int], name: str) -> list[int]:
                adapter = "" if name == "__base__" else name
                return [
                    t.id async for t in decoder.generate(EngineRequest(prompt, greedy(8), adapter=adapter))
                ]

            mixed = await asyncio.gather(*(one(p, n) for p, n in zip(prompts, names, strict=True)))
            assert mixed == expected
        finally:
            await decoder.close()

    asyncio.run(scenario())


def test_an_adapter_in_use_is_detached_once_its_replies_end_and_takes_its_cache_entries(
    model: Any, tmp_path: Any
) -> None:
    from app_toolkit.llm.engines.adapters import read
    from tests.lora_models import peft_adapter

    peft_adapter(model, tmp_path / "legal", seed=1)

    async def scenario() -> None:
        served = type(model)(model.config)
        served.load_state_dict(model.state_dict())
        prefixes = PrefixCache(max_bytes=1 << 24)
        decoder = Decoder(served.eval(), set(), max_batch_size=2, prefix_cache=prefixes)
        try:
            stalled = await decoder.attach(read(tmp_path, "legal", max_rank=16))
            assert 0 <= stalled < 5  # the passes waited that long (measured, not a bound)
            with pytest.raises(ValueError, match="is not attached"):
                await anext(decoder.generate(EngineRequest(PROMPTS[0], greedy(4), adapter="medical")))
            long_reply = decoder.generate(EngineRequest(PROMPTS[1], greedy(10_000), adapter="legal"))
            assert isinstance(long_reply, AsyncGenerator)
            await anext(long_reply)
            decoder.detach("legal")  # evicted while a reply uses it: it stays until that ends
            await anext(long_reply)
            assert decoder.adapters == {"legal"} and any(key[0] == "legal" for key in prefixes._entries)
            await long_reply.aclose()
            await wait_for_async(lambda: not decoder.adapters, 5, "the adapter to be detached")
            assert not any(key[0] == "legal" for key in prefixes._entries)
            assert await reply(decoder, PROMPTS[0], max_tokens=3)  # the base model still serves
        finally:
            await decoder.close()

    asyncio.run(scenario())


def test_an_adapter_for_another_model_is_refused_and_leaves_the_model_as_it_was(
    model: Any, tmp_path: Any
) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from app_toolkit.llm.engines.adapters import AdapterRefused, read
    from tests.lora_models import peft_adapter

    other = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2
        )
    )
    peft_adapter(other, tmp_path / "elsewhere", seed=3)
    peft_adapter(model, tmp_path / "here", seed=4)
    peft_adapter(model, tmp_path / "dora", seed=5, dora=True)
    with pytest.raises(AdapterRefused, match="is a DoRA adapter: only plain LoRA adapters"):
        read(tmp_path, "dora", max_rank=16)  # peft mixes no DoRA adapter in a batch

    async def scenario() -> None:
        served = type(model)(model.config)
        served.load_state_dict(model.state_dict())
        decoder = Decoder(served.eval(), set(), max_batch_size=2)
        try:
            before = await reply(decoder, PROMPTS[0], max_tokens=6)
            for attached in ((), ("here",)):  # the first adapter, and one beside another
                for name in attached:
                    await decoder.attach(read(tmp_path, name, max_rank=16))
                with pytest.raises(AdapterRefused, match="does not fit this model"):
                    await decoder.attach(read(tmp_path, "elsewhere", max_rank=16))
                assert decoder.adapters == set(attached)
                assert await reply(decoder, PROMPTS[0], max_tokens=6) == before
        finally:
            await decoder.close()

    asyncio.run(scenario())


def test_logprobs_are_the_models_log_softmax_and_the_greedy_token_ranks_first(model: Any) -> None:
    """Each token's log-probability is the model's own (before any penalty or bias, as
    vLLM's raw logprobs), within 1e-4 of a forward pass over the prompt and the reply so far."""
    penalised = Sampling(max_tokens=6, temperature=0, logprobs=3, repetition_penalty=1.5)
    tokens = asyncio.run(_logprobs_reply(model, PROMPTS[1], penalised))
    assert len(tokens) == 6
    sequence = list(PROMPTS[1])
    for token in tokens:
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([sequence])).logits[0, -1].float()
        expected = torch.log_softmax(logits, dim=-1)
        assert token.logprobs.logprob == pytest.approx(float(expected[token.id]), abs=1e-4)
        likeliest = torch.topk(expected, 3)
        assert [candidate for candidate, _ in token.logprobs.top] == likeliest.indices.tolist()
        assert [value for _, value in token.logprobs.top] == pytest.approx(
            likeliest.values.tolist(), abs=1e-4
        )
        sequence.append(token.id)
    # Without a penalty the greedy token is the likeliest: it ranks first among the top.
    plain = asyncio.run(_logprobs_reply(model, PROMPTS[0], Sampling(max_tokens=6, temperature=0, logprobs=2)))
    assert all(token.logprobs.top[0] == (token.id, token.logprobs.logprob) for token in plain)


async def _logprobs_reply(model: Any, prompt: list[int], sampling: Sampling) -> list[Any]:
    decoder = Decoder(model, set(), max_batch_size=2)
    try:
        return [token async for token in decoder.generate(EngineRequest(prompt, sampling))]
    finally:
        await decoder.close()
