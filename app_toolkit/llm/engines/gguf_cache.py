"""The de-quantized copy of a GGUF model, kept on disk so that the next load reads it
instead of de-quantizing the file again.

transformers reads a GGUF file by de-quantizing every tensor and rebuilding the tokenizer
from the file's vocabulary: SmolLM2-135M-Instruct takes about 35 s of a core each time a
replica starts. The first load writes what it built (config, weights as safetensors,
tokenizer) to a folder named after the file (its path, size and modification time) and
the transformers and torch versions; the later ones read that folder, in about 2 s.

Where: ``$APP_TOOLKIT_GGUF_CACHE``, else ``$XDG_CACHE_HOME/app_toolkit/gguf``, else
``~/.cache/app_toolkit/gguf``; ``APP_TOOLKIT_GGUF_CACHE=off`` keeps no copy. A copy is
written only while the weights take at most :data:`MAX_BYTES` (the copy holds them
de-quantized: four bytes a weight in float32), whole or not at all (written beside,
then renamed), and readable only by its owner. A copy that cannot be written (a
read-only or full disk) is logged and skipped: the model loads either way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: The variable naming the cache's folder (or ``off``).
CACHE_ENV = "APP_TOOLKIT_GGUF_CACHE"
_OFF = ("off", "0", "false", "no")
#: The largest de-quantized weights a copy is written for (bytes).
MAX_BYTES = 2 << 30
_ABOUT = "app_toolkit.json"  # written last: a folder without it is not a copy


def root() -> Path | None:
    """The cache's folder, or None when the cache is off."""
    configured = os.environ.get(CACHE_ENV, "").strip()
    if configured.lower() in _OFF:
        return None
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "app_toolkit" / "gguf"


def _key(gguf: Path, dtype: str) -> str:
    import torch
    import transformers

    stat = gguf.stat()
    versions = (transformers.__version__, torch.__version__)
    parts = (str(gguf.resolve()), stat.st_size, stat.st_mtime_ns, dtype, *versions)
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:32]


def find(gguf: Path, dtype: str) -> tuple[Path, str] | None:
    """The copy of ``gguf`` loaded as ``dtype`` and the type its weights have, if one
    was written."""
    folder = root()
    if folder is None:
        return None
    copy = folder / _key(gguf, dtype)
    try:
        about = json.loads((copy / _ABOUT).read_text())
        return copy, str(about["dtype"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(gguf: Path, dtype: str, model: Any, tokenizer: Any) -> Path | None:
    """Write the copy of ``gguf`` (as loaded with ``dtype``): the folder, or None when
    none was written (the cache off, the weights too large, the disk refused)."""
    folder = root()
    if folder is None:
        return None
    size = sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values())
    if size > MAX_BYTES:
        logger.info(
            "Not keeping a de-quantized copy of %s: its weights take %.1f GiB, above the %.0f GiB a copy "
            "may take; each load de-quantizes the file again",
            gguf,
            size / 2**30,
            MAX_BYTES / 2**30,
        )
        return None
    copy = folder / _key(gguf, dtype)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        written = Path(tempfile.mkdtemp(prefix=".writing-", dir=folder))
    except OSError as exc:
        logger.warning("Could not keep a de-quantized copy of %s in %s: %s", gguf, folder, exc)
        return None
    try:
        _write(written, gguf, model, tokenizer)
        os.rename(written, copy)  # whole or not at all; another replica may have won
    except OSError as exc:
        shutil.rmtree(written, ignore_errors=True)
        if (copy / _ABOUT).is_file():
            return copy
        logger.warning("Could not keep a de-quantized copy of %s in %s: %s", gguf, folder, exc)
        return None
    logger.info("Kept a de-quantized copy of %s in %s: the next load reads it", gguf, copy)
    return copy


def _write(folder: Path, gguf: Path, model: Any, tokenizer: Any) -> None:
    from safetensors.torch import save_model  # transformers' own dependency

    # Not model.save_pretrained: transformers refuses it for a model read from GGUF.
    model.config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"))  # tied weights stored once
    tokenizer.save_pretrained(folder)
    about = {"gguf": str(gguf), "dtype": str(model.dtype).removeprefix("torch.")}
    (folder / _ABOUT).write_text(json.dumps(about))
