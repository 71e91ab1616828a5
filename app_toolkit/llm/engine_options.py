"""``engine_kwargs``: vLLM's engine arguments that mean the same for the engines here.

An ``LLMConfig`` written for Ray Serve LLM passes vLLM's arguments; those with a
counterpart are taken under vLLM's name (:class:`EngineKwargs`) and handed to the engine
as :class:`EngineOptions`, in the engine's own terms; vLLM's parsers of a reply
(``tool_call_parser``, ``reasoning_parser``) are read by the model's replica
(``replica/parsers.py``). Every other argument is vLLM's own, for the vLLM engine, or
refused by name (``vllm_arguments.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from app_toolkit.config.schema import Strict, field_errors
from app_toolkit.llm import vllm_arguments

TorchDtype = Literal["auto", "float16", "bfloat16", "float32"]
#: vLLM's dtype names, and the torch dtype each means ("auto": the checkpoint's own).
DTYPES: dict[str, TorchDtype] = {
    "auto": "auto",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
}
#: The bytes the prefix cache keeps where ``kv_cache_memory_bytes`` says none.
PREFIX_CACHE_BYTES = 1 << 30
#: The engines (``app_toolkit.llm.engines``) an LLM deployment can run.
EngineName = Literal["vllm", "transformers", "echo", "embeddings"]


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """What an engine is built with, from ``engine_kwargs`` (vLLM's name in brackets).
    Made by :meth:`EngineKwargs.options`, where the defaults live (``EngineKwargs().options()``)."""

    #: Most tokens of one sequence, prompt and reply (``max_model_len``); None: the
    #: model's own context window.
    context_window: int | None
    #: Replies decoded at once in one batch (``max_num_seqs``); more wait for a slot.
    slots: int
    #: Keep the KV cache of a prompt's prefix for later prompts that start alike
    #: (``enable_prefix_caching``), up to ``prefix_cache_bytes`` (``kv_cache_memory_bytes``).
    prefix_caching: bool
    prefix_cache_bytes: int
    #: The weights' dtype once loaded (``dtype``; vLLM's "half" and "float" as torch names).
    dtype: TorchDtype
    #: Serve LoRA adapters on this model (``enable_lora``), at most ``max_loras`` in one
    #: batch (``max_loras``), each of rank at most ``max_lora_rank`` (``max_lora_rank``).
    lora: bool
    max_loras: int
    max_lora_rank: int


class EngineKwargs(Strict):
    """``LLMConfig.engine_kwargs``: the vLLM engine arguments the engines here take."""

    max_model_len: int | None = Field(
        None, ge=1, description="Most tokens of one sequence (prompt and reply); null: the model's own."
    )
    max_num_seqs: int = Field(
        8,
        ge=1,
        description="Replies decoded at once (decoding slots); more wait for a slot. vLLM's "
        "default is 256 on a GPU; 8 suits a small model on a few CPU cores.",
    )
    enable_prefix_caching: bool = Field(
        True, description="Reuse the KV cache of a prompt prefix seen before (vLLM's default: on)."
    )
    kv_cache_memory_bytes: int | None = Field(
        None,
        ge=0,
        description="The memory, in bytes, the keys and values of sequences read before may take "
        "for prefix caching (vLLM: the whole KV cache; the running batch's own is bounded here by "
        "max_num_seqs and max_model_len); null: 1 GiB.",
    )
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto", description="The weights' dtype once loaded; \"auto\": the checkpoint's own."
    )
    enable_lora: bool = Field(False, description="Serve LoRA adapters on this model (docs/llm.md).")
    max_loras: int = Field(1, ge=1, description="Most LoRA adapters in one batch.")
    max_lora_rank: int = Field(16, ge=1, description="Highest rank of a LoRA adapter it loads.")
    runner: Literal["auto", "generate", "pooling"] = Field(
        "auto",
        description='"pooling" serves the model as an embedding model (/v1/embeddings); '
        '"auto" and "generate": as a generative model.',
    )
    task: Literal["auto", "generate", "embed", "embedding"] = Field(
        "auto", description='Older vLLM releases\' name for runner: "embed" is runner "pooling".'
    )
    chat_template: str | None = Field(
        None,
        description="The chat template to use instead of the model's (vLLM's frontend argument, "
        "on every engine): a Jinja template, or the path of a file holding one on every node "
        "that runs the model.",
    )

    tool_call_parser: str | None = Field(
        None,
        description="vLLM's tool-call parser (vLLM's frontend argument, by its name: hermes, "
        'llama3_json...): with enable_auto_tool_choice, a tool_choice "auto" reply is generated '
        "freely and its text parsed into tool calls, as vllm serve does; null: tool calls come from "
        "constrained decoding (docs/llm.md). Needs vLLM in the replica.",
    )
    enable_auto_tool_choice: bool = Field(
        False,
        description='Parse tool_choice "auto" replies with tool_call_parser (which it needs, as in vLLM).',
    )
    reasoning_parser: str | None = Field(
        None,
        description="vLLM's reasoning parser (by its name: qwen3, deepseek_r1...): a chat reply's "
        "reasoning goes to the message's reasoning field, as vllm serve does. Needs vLLM in the "
        "replica.",
    )

    vllm_arguments: dict[str, Any] = Field(
        default_factory=dict,
        description="Every other key of engine_kwargs: vLLM's own engine arguments, which only "
        "the vLLM engine takes (docs/llm.md); a config with one needs vLLM in the replica.",
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: object) -> object:
        if not isinstance(data, Mapping):
            return data
        problems: dict[str, str] = {}
        for key in ("model", "served_model_name"):
            problems[key] = (
                "not taken in engine_kwargs (Ray Serve LLM refuses it too); set "
                "model_loading_config.model_id and model_source instead"
            )
        problems["vllm_arguments"] = "give vLLM's arguments as keys of engine_kwargs itself"
        named: dict[str | tuple[str, ...], tuple[object, str]] = {
            key: (data[key], problem) for key, problem in problems.items() if key in data
        }
        if named:
            raise field_errors("engine_kwargs", named)
        typed = {key: value for key, value in data.items() if key in cls.model_fields}
        others = {key: value for key, value in data.items() if key not in typed}
        wrong = vllm_arguments.refused(others) | _parallel_sizes(others)
        if not wrong and others and vllm_arguments.usable():  # vLLM's check (the replica's too)
            wrong = vllm_arguments.unknown_arguments(sorted(others))
        if wrong:
            raise field_errors("engine_kwargs", {key: (others.get(key), wrong[key]) for key in wrong})
        return {**typed, "vllm_arguments": others} if others else typed

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """Dumped as it is written: vLLM's own arguments as keys of engine_kwargs."""
        dumped: dict[str, object] = handler(self)
        return {**{k: v for k, v in dumped.items() if k != "vllm_arguments"}, **self.vllm_arguments}

    @property
    def embeds(self) -> bool:
        """The model is served as an embedding model (``runner: pooling`` or ``task: embed``)."""
        return self.runner == "pooling" or self.task in ("embed", "embedding")

    @model_validator(mode="after")
    def _parsers_known(self) -> EngineKwargs:
        """vLLM's rule (``validate_parsed_serve_args``): auto tool choice needs a parser; and
        each parser is one vLLM has, checked where vLLM imports (the replica checks again)."""
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise field_errors(
                "engine_kwargs",
                {
                    "enable_auto_tool_choice": (
                        True,
                        "enable_auto_tool_choice requires tool_call_parser (as vLLM's "
                        "--enable-auto-tool-choice does): name one, or remove it",
                    )
                },
            )
        given = self.parsers
        if given and vllm_arguments.usable():
            unknown = vllm_arguments.unknown_parsers(**given)
            if unknown:
                raise field_errors("engine_kwargs", {key: (given[key], unknown[key]) for key in unknown})
        return self

    @property
    def parsers(self) -> dict[str, str]:
        """vLLM's parsers these arguments name, by argument (``tool_call_parser``,
        ``reasoning_parser``); empty: none."""
        named = {"tool_call_parser": self.tool_call_parser, "reasoning_parser": self.reasoning_parser}
        return {key: name for key, name in named.items() if name}

    @model_validator(mode="after")
    def _one_runner(self) -> EngineKwargs:
        if (self.runner == "generate" and self.task in ("embed", "embedding")) or (
            self.runner == "pooling" and self.task == "generate"
        ):
            raise ValueError(
                f"runner {self.runner!r} and task {self.task!r} disagree; keep runner (task is "
                "its older name)"
            )
        return self

    def for_vllm(self) -> dict[str, Any]:
        """vLLM's engine arguments these mean: the keys set here, as vLLM names them
        (``max_num_seqs`` always: this toolkit's default, 8, sizes the replica's
        admission; ``reasoning_parser`` too, as ``vllm serve`` gives it to its engine, where
        a grammar waits for the reasoning's end), and vLLM's own arguments."""
        frontend = {"runner", "task", "chat_template", "tool_call_parser", "enable_auto_tool_choice"}
        shared = self.model_dump(
            include=self.model_fields_set - frontend - {"vllm_arguments"}, exclude_none=True
        )
        return {**shared, "max_num_seqs": self.max_num_seqs, **self.vllm_arguments}

    def options(self) -> EngineOptions:
        """The engine's options these arguments mean."""
        return EngineOptions(
            context_window=self.max_model_len,
            slots=self.max_num_seqs,
            prefix_caching=self.enable_prefix_caching,
            prefix_cache_bytes=(
                PREFIX_CACHE_BYTES if self.kv_cache_memory_bytes is None else self.kv_cache_memory_bytes
            ),
            dtype=DTYPES[self.dtype],
            lora=self.enable_lora,
            max_loras=self.max_loras,
            max_lora_rank=self.max_lora_rank,
        )


def _parallel_sizes(arguments: Mapping[str, object]) -> dict[str, str]:
    """A device count that is not a whole number of at least 1, named: the replica reserves
    a bundle per device, so the count must be what vLLM will read."""
    names = ("tensor_parallel_size", "pipeline_parallel_size")
    sizes = {name: arguments[name] for name in names if name in arguments}
    return {
        name: "a whole number of devices, at least 1"
        for name, size in sizes.items()
        if not (isinstance(size, int) and not isinstance(size, bool) and size >= 1)
    }
