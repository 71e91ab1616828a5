"""Text to token ids and back with a Hugging Face tokenizer: what every engine that reads
a Hugging Face model folder does the same way (the transformers and vLLM engines)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..protocol import TEMPLATE_ARGUMENTS

#: Tokens that end an assistant's turn in common chat templates (ChatML, Llama 3, Phi,
#: Gemma): a reply ends there even when the checkpoint names another end-of-sequence token.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


def end_of_turn_ids(tokenizer: Any) -> set[int]:
    """The ids of :data:`END_OF_TURN_TOKENS` in ``tokenizer``'s vocabulary."""
    vocabulary = tokenizer.get_vocab()
    return {vocabulary[name] for name in END_OF_TURN_TOKENS if name in vocabulary}


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
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """The conversation through the tokenizer's chat template, ready for the assistant's
        turn; ``tools`` (OpenAI's shape) go to the template, which shows them if it can;
        ``template_kwargs`` are more of the template's variables (as vLLM passes them:
        ones the template does not read change nothing)."""
        extra: dict[str, Any] = {"tools": tools} if tools else {}
        encoded = self._loaded_tokenizer().apply_chat_template(
            messages,
            add_generation_prompt=True,
            tokenize=True,
            **extra,
            **{key: value for key, value in (template_kwargs or {}).items() if key not in TEMPLATE_ARGUMENTS},
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
