"""LoRA adapters for the tests, with non-zero weights: made with peft on the decoder tests'
tiny Llama, or written from a model's shapes alone (no model loaded) for SmolLM2."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from app_toolkit.llm.engines.adapters import GRADIENT_CHECKPOINTING

#: SmolLM2-135M's shapes: 30 layers, 576 wide, 3 key/value heads of 64.
SMOLLM2_LAYERS = 30
SMOLLM2_PROJECTIONS = {"q_proj": (576, 576), "v_proj": (576, 192)}


def peft_adapter(model: Any, folder: Path, seed: int, rank: int = 4, dora: bool = False) -> Path:
    """An adapter of ``model`` (its q and v projections) saved by peft into ``folder``,
    initialised at random (non-zero, so it changes the replies); ``model`` is unchanged."""
    from peft import LoraConfig, get_peft_model

    copy = type(model)(model.config)
    copy.load_state_dict(model.state_dict())
    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=["q_proj", "v_proj"],
        init_lora_weights=False,
        use_dora=dora,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", GRADIENT_CHECKPOINTING, FutureWarning)
        get_peft_model(copy, config).save_pretrained(str(folder))
    return folder


def written_adapter(folder: Path, seed: int, rank: int = 4, scale: float = 0.2) -> Path:
    """An adapter for SmolLM2 written straight to peft's files (no model loaded)."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(SMOLLM2_LAYERS):
        for name, (inputs, outputs) in SMOLLM2_PROJECTIONS.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            weights[f"{prefix}.lora_A.weight"] = torch.randn(rank, inputs, generator=generator) * scale
            weights[f"{prefix}.lora_B.weight"] = torch.randn(outputs, rank, generator=generator) * scale
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": sorted(SMOLLM2_PROJECTIONS),
        "lora_dropout": 0.0,
        "bias": "none",
        "inference_mode": True,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder
