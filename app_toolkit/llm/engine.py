"""What an LLM deployment needs from an engine: the contract between the serving side
(``server.py``, the OpenAI endpoints) and the engines under ``engines/``.

Engines work in token ids. Text, stop strings, chat templates' output and OpenAI shapes are
the server's business, so every engine streams the same way and a new engine implements
only what differs: loading, tokenizing, and producing the next token.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Sampling:
    """How one reply's tokens are chosen (OpenAI's and vLLM's request fields, checked)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    #: Token ids that end the reply besides the model's end-of-sequence tokens.
    stop_token_ids: tuple[int, ...] = ()
    #: Generate past the end-of-sequence tokens (vLLM's ``ignore_eos``; benchmarks).
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What one engine holds now, for autoscaling and routing.

    ``slots`` is how many replies it decodes at once (0: no limit it knows of). ``running``
    has, per reply holding a slot, the tokens it may still produce. ``queued`` has, per
    reply waiting for a slot in queue order, its prompt tokens and max_tokens. ``step_s`` is
    the time of one decoding step lately (0 before the first).
    """

    slots: int
    running: tuple[int, ...] = ()
    queued: tuple[tuple[int, int], ...] = ()
    step_s: float = 0.0


@runtime_checkable
class Constraint(Protocol):
    """Structured output for one reply (``structured.py`` makes them from a grammar): which
    tokens may come next. The engine asks before sampling each token and reports the one
    it chose; an engine that enforces grammars itself (vLLM) reads ``grammar`` instead of
    asking, and still reports each token."""

    #: The grammar's text, in llguidance's Lark syntax.
    grammar: str

    def allowed(self, vocab_size: int) -> Any:
        """A boolean ``torch.Tensor`` of ``vocab_size``: True where a token may come next."""

    def accept(self, token_id: int) -> None:
        """The token the engine chose (one ``allowed`` said may come)."""

    @property
    def finished(self) -> bool:
        """The grammar is complete: the reply ends here (finish reason ``stop``)."""


class TextEngine(Protocol):
    """A causal language model behind continuous batching."""

    #: Which engine it is ("vllm", "transformers", "echo", "embeddings").
    name: str

    #: Tokens the model reads and writes in one sequence (prompt + reply).
    context_window: int
    #: Replies decoded at once (vLLM's ``max_num_seqs``); 0: no limit it knows of.
    slots: int

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to ``vocab_size - 1``."""

    #: The Hugging Face tokenizer (chat templates, grammars); None for engines without one.
    tokenizer: Any

    def load(self) -> None:
        """Load the model (once per replica, in its constructor)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``."""

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (special tokens skipped)."""

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a conversation through the model's chat template, ready for the
        assistant's turn (``messages`` in OpenAI's shape, content already text);
        ``template_kwargs``: more variables for the template (vLLM's
        ``chat_template_kwargs``)."""

    def generate(
        self,
        prompt: list[int],
        sampling: Sampling,
        constraint: Constraint | None = None,
        on_slot: Callable[[], None] | None = None,
        on_prompt: Callable[[int], None] | None = None,
        adapter: str = "",
    ) -> AsyncGenerator[int, None]:
        """Token ids of one reply, as each is decoded (with LoRA adapter ``adapter``, one
        the engine loaded; "": the base model); ends at an end-of-sequence or stop
        token (not yielded), at ``sampling.max_tokens``, or when ``constraint`` is
        finished. Closing the iterator takes the reply out of the batch at once.
        ``on_slot`` is called when the reply leaves the engine's queue for a slot (its
        time in the queue is a metric); ``on_prompt`` once the prompt is read, with how
        many of its tokens came from a prefix cache (0: none, or no cache)."""

    def current_load(self) -> EngineLoad:
        """What it holds now; cheap, never waits."""

    async def close(self) -> None:
        """Free the model."""


class EmbeddingEngine(Protocol):
    """A model that turns texts into vectors."""

    #: Which engine it is ("vllm", "transformers", "echo", "embeddings").
    name: str

    context_window: int
    #: Length of every vector it returns.
    dimensions: int

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to ``vocab_size - 1``."""

    tokenizer: Any

    def load(self) -> None:
        """Load the model (once per replica)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``."""

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``."""

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """One normalised vector per text, in order (a batch)."""

    async def close(self) -> None:
        """Free the model."""
