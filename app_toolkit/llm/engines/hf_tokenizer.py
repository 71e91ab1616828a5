"""Text to token ids and back with a Hugging Face tokenizer: what every engine that reads
a Hugging Face model folder does the same way (the transformers and vLLM engines)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TokenizerText:
    """``encode``, ``decode``, ``chat_prompt`` and ``vocab_size`` (``TextEngine``'s) over
    ``self.tokenizer``, which the engine sets when it loads (None before)."""

    tokenizer: Any = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``."""
        return list(self._loaded_tokenizer().encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``, special tokens skipped."""
        return str(self._loaded_tokenizer().decode(list(token_ids), skip_special_tokens=True))

    def chat_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """The conversation through the tokenizer's chat template, ready for the assistant's
        turn; ``tools`` (OpenAI's shape) go to the template, which shows them if it can."""
        extra = {"tools": tools} if tools else {}
        encoded = self._loaded_tokenizer().apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **extra
        )
        # transformers 5 returns a BatchEncoding (a mapping); older releases a plain list.
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to this less one (the tokenizer's, added tokens too)."""
        return len(self._loaded_tokenizer())

    def _loaded_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise RuntimeError("The engine is not loaded: call load() first (once per replica)")
        return self.tokenizer
