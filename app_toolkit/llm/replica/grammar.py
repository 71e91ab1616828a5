"""Grammars over a model's tokenizer, in the model's replica: the engine's
:class:`~app_toolkit.llm.engine.Constraint` for one reply, with llguidance.

llguidance's view of a tokenizer takes a fraction of a second to build, so there is one per
Hugging Face tokenizer (kept while the tokenizer lives). A grammar is compiled once per
text per tokenizer and kept in a bounded LRU; each reply walks its own copy (a copy costs
about a microsecond, a compile a millisecond or more). ``structured.py`` decides which
grammar a request gets; benchmarks/llm_grammar.py measures what a token costs.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING

import llguidance
import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt
    import torch
    from transformers import PreTrainedTokenizerFast

#: Compiled grammars kept per tokenizer (least recently used dropped first).
GRAMMAR_CACHE_SIZE = 64


class GrammarError(ValueError):
    """llguidance refused a grammar; the message is its reason (:func:`library_reason`)."""


def library_reason(message: str, positions: bool = False) -> str:
    """llguidance's error without its position in our generated grammar text (``at 1(8):
    failed to compile JSON schema: Invalid type: foo`` and the source lines after it):
    the part that speaks of the caller's schema, with the regex parser's own ``error:``
    line when it gives one. ``positions``: keep the position (the grammar is the caller's)."""
    lines = message.strip().splitlines() or ["invalid grammar"]
    head, colon, rest = lines[0].partition(": ")
    reason = rest if colon and head.startswith("at ") and not positions else lines[0]
    detail = next((line.strip() for line in lines[1:] if line.strip().startswith("error: ")), "")
    return f"{reason.rstrip(': ')}: {detail.removeprefix('error: ')}" if detail else reason


class _TokenizerGrammars:
    """One tokenizer's llguidance view and the grammars compiled for it."""

    def __init__(self, hf_tokenizer: PreTrainedTokenizerFast) -> None:
        import llguidance.hf  # imports transformers: only where a model has been loaded

        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer)
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, lark: str) -> llguidance.LLMatcher:
        """A fresh matcher at the start of ``lark``'s grammar (compiled on first use)."""
        with self._lock:
            compiled = self._compiled.get(lark)
            if compiled is not None:
                self._compiled.move_to_end(lark)
                return compiled.deep_copy()
        compiled = self._compile(lark)
        with self._lock:
            self._compiled[lark] = compiled
            while len(self._compiled) > GRAMMAR_CACHE_SIZE:
                self._compiled.popitem(last=False)
        return compiled.deep_copy()

    def _compile(self, lark: str) -> llguidance.LLMatcher:
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        compiled = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if compiled.is_error():
            raise GrammarError(library_reason(compiled.get_error()))
        return compiled


_tokenizers: weakref.WeakKeyDictionary[PreTrainedTokenizerFast, _TokenizerGrammars] = (
    weakref.WeakKeyDictionary()
)
_tokenizers_lock = threading.Lock()


def _grammars_for(hf_tokenizer: PreTrainedTokenizerFast) -> _TokenizerGrammars:
    with _tokenizers_lock:
        grammars = _tokenizers.get(hf_tokenizer)
        if grammars is None:
            grammars = _tokenizers[hf_tokenizer] = _TokenizerGrammars(hf_tokenizer)
        return grammars


def grammar_constraint(hf_tokenizer: PreTrainedTokenizerFast, lark: str) -> GrammarConstraint:
    """A constraint that holds one reply to ``lark`` (llguidance's Lark syntax) over a
    Hugging Face fast tokenizer. Raises :class:`GrammarError` if llguidance refuses it."""
    grammars = _grammars_for(hf_tokenizer)
    return GrammarConstraint(grammars.matcher(lark), grammars.tokenizer.vocab_size, lark)


class GrammarConstraint:
    """The engine's ``Constraint`` for one reply: which tokens may come next.

    ``allowed`` fills llguidance's bitmask in place and unpacks it into a boolean buffer
    kept for the reply; the tensor it returns shares that buffer, so it is valid until the
    next call. Ids past the tokenizer's vocabulary (a model's padded logits) are never
    allowed.
    """

    __slots__ = ("_matcher", "_bits", "_words", "_allowed", "_tensor", "grammar")

    def __init__(self, matcher: llguidance.LLMatcher, tokenizer_size: int, grammar: str) -> None:
        #: The grammar's text (llguidance's Lark), for an engine that enforces it itself.
        self.grammar = grammar
        self._matcher = matcher
        self._words = np.zeros((tokenizer_size + 31) // 32, dtype=np.int32)
        self._bits = self._words.view(np.uint8)
        self._allowed = np.zeros(0, dtype=np.bool_)
        self._tensor = _tensor(self._allowed)

    def allowed(self, vocab_size: int) -> torch.Tensor:
        """A boolean tensor of ``vocab_size``: True where a token may come next."""
        if self._allowed.shape[0] != vocab_size:
            self._allowed = np.zeros(vocab_size, dtype=np.bool_)
            self._tensor = _tensor(self._allowed)
        words = self._words
        self._matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        count = min(vocab_size, words.nbytes * 8)
        self._allowed[:count] = np.unpackbits(self._bits, count=count, bitorder="little").view(np.bool_)
        return self._tensor

    def accept(self, token_id: int) -> None:
        """Advance past the token the engine chose; one ``allowed`` did not allow raises
        ``ValueError`` (the engine sampled outside the mask)."""
        if not self._matcher.consume_token(token_id):
            raise ValueError(
                f"token {token_id} is not allowed by the reply's grammar: sample from the mask "
                f"allowed() returned ({library_reason(self._matcher.get_error())})"
            )

    @property
    def finished(self) -> bool:
        """The grammar can take nothing more (a JSON document closed, the last call ended
        when no other may follow); the reply ends here."""
        return bool(self._matcher.is_stopped())


def _tensor(array: npt.NDArray[np.bool_]) -> torch.Tensor:
    """A tensor sharing ``array``'s memory (torch is imported here, where replies are
    decoded: ``structured.py`` imports this module's errors where requests are read)."""
    import torch

    return torch.from_numpy(array)
