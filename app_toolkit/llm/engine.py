"""What an LLM deployment needs from an engine: the contract between the serving side
(``server.py``, the OpenAI endpoints) and the engines under ``engines/``.

Engines work in token ids. Text, stop strings, chat templates' output and OpenAI shapes are
the server's business, so every engine streams the same way and a new engine implements
only what differs: loading, tokenizing, and producing the next token.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from app_toolkit.exceptions import ReplicaUnavailableError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


class EngineFailed(RuntimeError):
    """The engine ended a reply or an embedding with an error before it was complete."""


class EngineStopped(ReplicaUnavailableError):
    """The engine stopped before a reply or an embedding was complete: closed as its
    replica ends (past the drain's deadline), or its process died. For its callers this is
    the model's replica going away (``tk.ReplicaUnavailableError``): another replica may
    serve the request, and it is answered as a lost replica is (a 503 with
    ``Retry-After``; a stream under way ends with the restart error)."""


@dataclass(frozen=True, slots=True)
class Sampling:
    """How one reply's tokens are chosen (OpenAI's and vLLM's request fields, checked),
    applied in vLLM's order: the grammar, ``logit_bias`` and ``min_tokens``, then the three
    penalties, then greedy (temperature 0) or the tempered distribution cut by ``min_p``,
    ``top_k`` and ``top_p``."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    #: Only the ``top_k`` likeliest tokens may come (0: no limit).
    top_k: int = 0
    #: Tokens less likely than ``min_p`` times the likeliest one may not come (0: none cut).
    min_p: float = 0.0
    seed: int | None = None
    #: Tokens of the prompt or the reply: a positive score divided by it, a negative one
    #: multiplied (transformers' and vLLM's; 1: none).
    repetition_penalty: float = 1.0
    #: Subtracted from the score of each token the reply holds (OpenAI's; 0: none).
    presence_penalty: float = 0.0
    #: Subtracted from a token's score once per time the reply holds it (OpenAI's; 0: none).
    frequency_penalty: float = 0.0
    #: (token id, bias) pairs added to those tokens' scores (OpenAI's ``logit_bias``).
    logit_bias: tuple[tuple[int, float], ...] = ()
    #: The reply's end-of-sequence and stop tokens may not come before this many tokens.
    min_tokens: int = 0
    #: Token ids that end the reply besides the model's end-of-sequence tokens.
    stop_token_ids: tuple[int, ...] = ()
    #: Generate past the end-of-sequence tokens (vLLM's ``ignore_eos``; benchmarks).
    ignore_eos: bool = False
    #: Each token comes with its log-probability and the ``logprobs`` likeliest tokens'
    #: (vLLM's ``logprobs``: 0, the token's own only; at most :data:`MAX_LOGPROBS`); None: none.
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        """The likeliest token is taken (temperature 0, as in vLLM)."""
        return self.temperature <= 0

    @property
    def penalised(self) -> bool:
        """A penalty changes the scores."""
        return self.repetition_penalty != 1.0 or bool(self.presence_penalty) or bool(self.frequency_penalty)


#: The most likeliest tokens a reply's token may come with (vLLM's ``max_logprobs``).
MAX_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class Logprobs:
    """How likely the model found a token it produced: its log-probability and the
    likeliest tokens' as (token id, log-probability), likeliest first. As vLLM's default
    (``raw_logprobs``), they are the model's own, before any bias, penalty, temperature,
    cut or grammar."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Token:
    """One token of a reply, as an engine yields it."""

    id: int
    #: With ``Sampling.logprobs`` set; None otherwise.
    logprobs: Logprobs | None = None
    #: The token that ended the reply (an end of sequence or a stop token id): the last one,
    #: counted in the reply's usage as vLLM counts it, never shown as text.
    ends: bool = False


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One reply to produce, as every engine takes it: the prompt's token ids, how to
    sample, and what follows it through the engine.

    ``constraint`` shapes the output (structured output); ``adapter`` is a LoRA adapter the
    engine loaded ("": the base model). ``on_slot`` is called when the reply leaves the
    engine's queue for a slot (its time in the queue is a metric); ``on_prompt`` once the
    prompt is read, with how many of its tokens came from a prefix cache (0: none, or no
    cache)."""

    prompt: list[int]
    sampling: Sampling
    constraint: Constraint | None = None
    adapter: str = ""
    on_slot: Callable[[], None] | None = None
    on_prompt: Callable[[int], None] | None = None
    #: The reply's tokens already produced (by a replica lost mid-reply): the engine reads
    #: them after the prompt and produces the rest. They count towards ``max_tokens``;
    #: an engine that can counts them towards ``min_tokens`` and the penalties as the
    #: reply's own (transformers), or reads them as prompt (vLLM: ``repetition_penalty``
    #: only); ``constraint`` has accepted them already. Only where the engine's
    #: ``capabilities.continuation`` allows.
    produced: tuple[int, ...] = ()
    #: The caller's priority class (its API key's: ``app_toolkit.get_request_priority``):
    #: lower goes first where the engine queues (vLLM's meaning; 0 by default).
    priority: int = 0


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What one engine holds now, for autoscaling and routing: counts every engine gives,
    and per-reply detail where the engine keeps it (vLLM's scheduler gives counts only).

    ``slots`` is how many replies it decodes at once (0: no limit it knows of). ``running``
    replies hold a slot (reading their prompt or decoding); ``waiting`` ones wait for one.
    ``kv_cache_use`` is the share of its KV cache in use, 0 to 1 (0 where it bounds none).
    ``step_s`` is the time of one decoding step lately (0 before the first, or not known).
    The detail, when given, has one item per reply: ``remaining``, per running reply, the
    tokens it may still produce; ``queued``, per waiting reply in queue order, its prompt
    tokens and the tokens it may produce.
    """

    slots: int
    running: int = 0
    waiting: int = 0
    kv_cache_use: float = 0.0
    step_s: float = 0.0
    remaining: tuple[int, ...] | None = None
    queued: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.running, int) and isinstance(self.waiting, int)):
            raise TypeError("EngineLoad: running and waiting are counts (ints)")
        if min(self.slots, self.running, self.waiting) < 0 or not 0.0 <= self.kv_cache_use <= 1.0:
            raise ValueError(f"EngineLoad: counts below 0, or a KV cache use outside 0 to 1: {self}")
        if self.remaining is not None and len(self.remaining) != self.running:
            raise ValueError(f"EngineLoad: {len(self.remaining)} remaining, {self.running} running")
        if self.queued is not None and len(self.queued) != self.waiting:
            raise ValueError(f"EngineLoad: {len(self.queued)} queued, {self.waiting} waiting")

    @classmethod
    def of(
        cls,
        slots: int,
        remaining: tuple[int, ...],
        queued: tuple[tuple[int, int], ...] = (),
        step_s: float = 0.0,
        kv_cache_use: float = 0.0,
    ) -> EngineLoad:
        """The load of an engine that keeps every reply's detail: the counts are its length."""
        return cls(
            slots,
            len(remaining),
            len(queued),
            kv_cache_use=kv_cache_use,
            step_s=step_s,
            remaining=remaining,
            queued=queued,
        )


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a text engine can do beyond producing tokens, declared (read after ``load()``:
    some depend on the engine's arguments), so the server asks no engine what it has. LoRA
    is declared by ``TextEngine.adapters`` (None: none)."""

    #: It reads a prompt that starts like one read before from a cache (``on_prompt`` says
    #: how many tokens came from it).
    prefix_cache: bool = False
    #: It gives its tokens' log-probabilities (``Sampling.logprobs``).
    logprobs: bool = False
    #: How it keeps to a :class:`Constraint`: "masks" asks ``allowed`` before each token,
    #: "native" compiles ``grammar`` itself; "" takes no constraint (no structured output).
    structured: Literal["masks", "native", ""] = ""
    #: Which replies it continues from the tokens already produced
    #: (``EngineRequest.produced``): "all", "unconstrained" (none under a constraint), or "".
    continuation: Literal["all", "unconstrained", ""] = ""


class Adapters(Protocol):
    """The LoRA adapters of an engine's folder, as the server loads and uses them."""

    def ids(self) -> list[str]:
        """The adapters its folder holds now."""

    def holds(self, adapter_id: str) -> bool:
        """Whether its folder holds adapter ``adapter_id`` now."""

    async def load(self, adapter_id: str) -> None:
        """Make ``adapter_id`` ready for replies; AdapterNotFound / AdapterRefused
        (``engines/adapters.py``) when it cannot be served."""

    def hold(self, adapter_id: str) -> None:
        """A reply will use ``adapter_id`` (held from before its load: the server holds it,
        then loads it): once loaded, it stays until :meth:`release`."""

    def release(self, adapter_id: str) -> None:
        """A reply that held ``adapter_id`` ended."""

    def unload(self, adapter_id: str) -> None:
        """Let go of ``adapter_id`` once no reply holds it."""


@runtime_checkable
class Constraint(Protocol):
    """Structured output for one reply (``structured.py`` makes them from a grammar): which
    tokens may come next. The engine asks before sampling each token and reports the one
    it chose; an engine that enforces grammars itself (vLLM) reads ``grammar`` instead of
    asking, and still reports each token."""

    #: The grammar's text, in llguidance's Lark syntax.
    grammar: str

    def allowed(self, vocab_size: int) -> torch.Tensor:
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
    #: What it serves (an :class:`EmbeddingEngine` says "embed").
    task: Literal["generate"]
    #: What it can do (valid once loaded).
    capabilities: Capabilities

    @property
    def adapters(self) -> Adapters | None:
        """Its LoRA adapters; None: it serves the base model only."""

    #: Tokens the model reads and writes in one sequence (prompt + reply).
    context_window: int
    #: Replies decoded at once (vLLM's ``max_num_seqs``); 0: no limit it knows of.
    slots: int

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to ``vocab_size - 1``."""

    #: The Hugging Face tokenizer (chat templates, grammars: a fast one); None for engines
    #: without one. Any: each engine holds its own tokenizer class.
    tokenizer: Any

    def load(self) -> None:
        """Load the model (once per replica, in its constructor)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``."""

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``, special tokens skipped unless ``skip_special_tokens`` is
        False (vLLM's request field: then their text shows)."""

    def added_tokens(self) -> Mapping[int, str]:
        """The tokens added to the model's vocabulary (its special tokens among them) by id,
        with their text: vLLM's ``spaces_between_special_tokens`` false joins these."""

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (part of a character, for some)."""

    def chat_prompt(
        self,
        messages: Sequence[Mapping[str, object]],
        tools: Sequence[Mapping[str, object]] | None = None,
        template_kwargs: Mapping[str, object] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        """Token ids of a conversation through the model's chat template, ready for the
        assistant's turn (``messages`` in OpenAI's shape, content already text);
        ``template_kwargs``: more variables for the template (vLLM's
        ``chat_template_kwargs``); ``add_generation_prompt`` False: without the assistant's
        turn opened; ``continue_final_message``: the last message left open, for the reply
        to go on with it. Raises ValueError for what the template refuses (its own checks;
        a last message it cannot leave open)."""

    def generate(self, request: EngineRequest) -> AsyncGenerator[Token, None]:
        """The tokens of one reply (after ``request.produced``), as each is decoded; ends at
        an end-of-sequence or stop token (yielded last, marked ``ends``), at
        ``sampling.max_tokens``, or when the constraint is finished. Closing the iterator
        takes the reply out of the batch at once. Raises :class:`EngineStopped` once the
        engine has closed or died, :class:`EngineFailed` when it ends the reply with an
        error of its own."""

    def current_load(self) -> EngineLoad:
        """What it holds now; cheap, never waits."""

    async def check_health(self) -> None:
        """Raise if the engine can serve no more (a process of its died, its loop ended):
        the replica's health check fails and the replica is replaced."""

    async def close(self) -> None:
        """Free the model; every reply still open ends with :class:`EngineStopped`."""


class EmbeddingEngine(Protocol):
    """A model that turns texts into vectors."""

    #: Which engine it is ("vllm", "transformers", "echo", "embeddings").
    name: str
    #: What it serves (a :class:`TextEngine` says "generate").
    task: Literal["embed"]

    context_window: int
    #: Length of every vector it returns.
    dimensions: int

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to ``vocab_size - 1``."""

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The model's Hugging Face tokenizer (None before it loads)."""

    def load(self) -> None:
        """Load the model (once per replica)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``."""

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``."""

    async def check_health(self) -> None:
        """Raise if the engine can serve no more."""

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One normalised vector per input, in order (a batch): token ids read as they are
        (no special tokens added: a text's are, by the :meth:`encode` that counted it).
        Raises :class:`EngineStopped` when the engine closes or dies first."""

    async def close(self) -> None:
        """Free the model."""
