"""Text to token ids and back with a Hugging Face tokenizer: what every engine that reads
a Hugging Face model folder does the same way (the transformers and vLLM engines)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from ..protocol import TEMPLATE_ARGUMENTS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Tokens that end an assistant's turn in common chat templates (ChatML, Llama 3, Phi,
#: Gemma): a reply ends there even when the checkpoint names another end-of-sequence token.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


def end_of_turn_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The ids of :data:`END_OF_TURN_TOKENS` in ``tokenizer``'s vocabulary."""
    vocabulary = tokenizer.get_vocab()
    return {vocabulary[name] for name in END_OF_TURN_TOKENS if name in vocabulary}


#: A byte-fallback token of a SentencePiece vocabulary (``<0xE2>``): one byte.
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
#: SentencePiece's mark for a space.
_SPACE_MARK = "\u2581"


@cache
def _byte_level_bytes() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's): each character back to the byte it stands for."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table: dict[int, str] = bytes_to_unicode()  # type: ignore[no-untyped-call]  # transformers: unannotated
    return {character: byte for byte, character in table.items()}


class _AddedToken(Protocol):
    """What :class:`TokenizerText` reads of a tokenizer's added token."""

    @property
    def content(self) -> str: ...


class _Tokenizer(Protocol):
    """What :class:`TokenizerText` reads of a Hugging Face tokenizer."""

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool) -> str: ...

    @property
    def added_tokens_decoder(self) -> Mapping[int, _AddedToken]: ...

    def convert_ids_to_tokens(self, ids: int) -> str | list[str]: ...

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, object]],
        *,
        add_generation_prompt: bool,
        continue_final_message: bool,
        tokenize: bool,
        **variables: object,
    ) -> Any: ...  # transformers 5: a BatchEncoding (a mapping); before: a list of ids

    def __len__(self) -> int: ...


class TokenizerText:
    """``encode``, ``decode``, ``added_tokens``, ``token_bytes``, ``chat_prompt`` and
    ``vocab_size`` (``TextEngine``'s) over ``self.tokenizer``, which the engine sets when it loads (None
    before)."""

    tokenizer: Any = None
    #: The tokenizer whose added tokens were read, and them (read once, when first asked).
    _added: tuple[object, Mapping[int, str]] | None = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``."""
        return list(self._loaded_tokenizer().encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``, special tokens skipped unless ``skip_special_tokens`` is False."""
        tokenizer = self._loaded_tokenizer()
        return str(tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def added_tokens(self) -> Mapping[int, str]:
        """The tokenizer's added tokens (its special ones among them) by id, with their text."""
        tokenizer = self._loaded_tokenizer()
        if self._added is None or self._added[0] is not tokenizer:
            added = {token_id: token.content for token_id, token in tokenizer.added_tokens_decoder.items()}
            self._added = (tokenizer, MappingProxyType(added))
        return self._added[1]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for: part of a character for some (a byte-level
        vocabulary's, a byte-fallback token), which its text cannot show."""
        tokenizer = self._loaded_tokenizer()
        piece = tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str):
            decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
            alphabet = _byte_level_bytes() if type(decoder).__name__ == "ByteLevel" else None
            if alphabet is not None and all(character in alphabet for character in piece):
                return bytes(alphabet[character] for character in piece)
            one = _BYTE_TOKEN.fullmatch(piece)
            if one is not None:
                return bytes([int(one.group(1), 16)])
            if _SPACE_MARK in piece:
                return piece.replace(_SPACE_MARK, " ").encode()
        # A special token's text too, as vLLM's logprobs show it whatever skip_special_tokens says.
        return self.decode([token_id], skip_special_tokens=False).encode()

    def chat_prompt(
        self,
        messages: Sequence[Mapping[str, object]],
        tools: Sequence[Mapping[str, object]] | None = None,
        template_kwargs: Mapping[str, object] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        """The conversation through the tokenizer's chat template, ready for the assistant's
        turn (``TextEngine.chat_prompt``); ``tools`` (OpenAI's shape) go to the template,
        which shows them if it can; ``template_kwargs`` are more of the template's variables
        (as vLLM passes them: ones the template does not read change nothing)."""
        from jinja2 import TemplateError

        extra: dict[str, object] = {"tools": tools} if tools else {}
        variables = template_kwargs or {}
        extra.update((key, value) for key, value in variables.items() if key not in TEMPLATE_ARGUMENTS)
        try:
            encoded = self._loaded_tokenizer().apply_chat_template(
                messages,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=True,
                **extra,
            )
        except TemplateError as exc:  # the template's own check (raise_exception), as TextEngine says
            raise ValueError(f"The chat template refused the conversation: {exc}") from exc
        # transformers 5 returns a BatchEncoding (a mapping); older releases a plain list.
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to this less one (the tokenizer's, added tokens too)."""
        return len(self._loaded_tokenizer())

    def _loaded_tokenizer(self) -> _Tokenizer:
        tokenizer: _Tokenizer | None = self.tokenizer
        if tokenizer is None:
            raise RuntimeError("The engine is not loaded: call load() first (once per replica)")
        return tokenizer
