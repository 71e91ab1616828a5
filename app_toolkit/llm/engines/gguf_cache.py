"""The de-quantized copy of a GGUF model, kept on disk so that the next load reads it
instead of de-quantizing the file again.

transformers reads a GGUF file by de-quantizing every tensor and rebuilding the tokenizer
from the file's vocabulary: SmolLM2-135M-Instruct takes about 35 s of a core each time a
replica starts. The first load writes what it built (config, weights as safetensors,
tokenizer) to a folder named after the file (its path, size and modification time) and
the transformers and torch versions; the later ones read that folder (0.7 s on this project's 2-core host).

Where: ``$APP_TOOLKIT_GGUF_CACHE``, else ``$XDG_CACHE_HOME/app_toolkit/gguf``, else
``~/.cache/app_toolkit/gguf`` (on each node: a Ray worker reads its own environment);
``APP_TOOLKIT_GGUF_CACHE=off`` (or ``0``, ``false``, ``no``) keeps no copy. A copy is
written only while the weights take at most :data:`MAX_BYTES` (the copy holds them
de-quantized: four bytes a weight in float32), whole or not at all (written beside,
then renamed), readable only by its owner, and read only while it still is (a folder
that is a link, another user's or open to others is passed over). A copy that cannot be
written (a read-only or full disk) is logged and skipped, and one that cannot be read is
logged, removed and written again: the model loads either way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from app_toolkit.exceptions import ConfigError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

#: The variable naming the cache's folder (or ``off``).
CACHE_ENV = "APP_TOOLKIT_GGUF_CACHE"
_OFF = ("off", "0", "false", "no")
#: The largest de-quantized weights a copy is written for (bytes).
MAX_BYTES = 2 << 30
#: The types a copy's weights may have: the weights' types the transformers engine takes.
DTYPES = ("float32", "bfloat16", "float16")
_ABOUT = "app_toolkit.json"  # written last: a folder without it is not a copy
_WRITING = ".writing-"
#: A folder being written for longer than this was left by a process that died.
_ABANDONED_AFTER_S = 3600.0
#: The copies' layout, part of their folders' names: a copy written by an older layout is
#: passed over (2: a plain checkpoint, its config naming the architecture and no GGUF
#: quantization, so that vLLM reads it too).
_LAYOUT = 2


class FromPretrained(TypedDict, total=False):
    """What transformers' ``from_pretrained`` is told of a model's files."""

    gguf_file: str
    dtype: torch.dtype
    use_safetensors: bool
    local_files_only: bool


@dataclass(frozen=True)
class Copy:
    """A de-quantized copy: its folder and the type of its weights."""

    folder: Path
    dtype: str


def root() -> Path | None:
    """The cache's folder, or None when the cache is off (ConfigError for a relative
    path: each process would read it from its own working directory)."""
    configured = os.environ.get(CACHE_ENV, "").strip()
    if configured.lower() in _OFF:
        return None
    if configured:
        folder = Path(configured).expanduser()
        if not folder.is_absolute():
            raise ConfigError(
                f"{CACHE_ENV}={configured!r} is a relative path; give an absolute one, or 'off' to keep no "
                "de-quantized copies"
            )
        return folder
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "app_toolkit" / "gguf"


def folder_for(gguf: Path, dtype: str) -> Path | None:
    """Where the copy of ``gguf`` loaded as ``dtype`` is kept (None: the cache is off).
    Named after the file's path, size and modification time, the dtype and the
    transformers and torch versions."""
    import torch
    import transformers

    folder = root()
    if folder is None:
        return None
    facts = gguf.stat()
    versions = (transformers.__version__, torch.__version__)
    parts = (str(gguf.resolve()), facts.st_size, facts.st_mtime_ns, dtype, *versions, _LAYOUT)
    return folder / hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:32]


def find(gguf: Path, dtype: str) -> Copy | None:
    """The copy of ``gguf`` loaded as ``dtype``, if one was written and is still this
    user's alone."""
    try:
        folder = folder_for(gguf, dtype)
        if folder is None:
            return None
        facts = folder.lstat()
        if not _private(facts):
            logger.warning(
                "Passing over %s: a copy must be a folder of this user's, closed to others", folder
            )
            return None
        about = json.loads((folder / _ABOUT).read_text())
    except (OSError, ValueError):
        return None
    found = about.get("dtype") if isinstance(about, dict) else None
    return Copy(folder, found) if found in DTYPES else None


def out_of_memory(error: BaseException) -> bool:
    """Whether reading a copy failed for want of memory (torch raises RuntimeError), not
    because the copy is damaged: such a copy is kept."""
    return (
        isinstance(error, MemoryError) or "not enough memory" in str(error) or "out of memory" in str(error)
    )


def discard(copy: Copy) -> None:
    """Remove a copy that could not be read, so that the next load writes it again."""
    shutil.rmtree(copy.folder, ignore_errors=True)


def store(gguf: Path, dtype: str, model: Any, tokenizer: Any) -> Copy | None:
    """Write the copy of ``gguf`` (as loaded with ``dtype``), or None when none was
    written (the cache off, the weights too large, the disk refused, the file gone).
    ``model``: a ``PreTrainedModel``, ``tokenizer`` a ``PreTrainedTokenizerBase`` (untyped:
    only the weights' sizes are read here, and tests pass stand-ins for both)."""
    try:
        copy = folder_for(gguf, dtype)
    except OSError as exc:  # the file removed or replaced while the model loaded
        logger.warning("Could not keep a de-quantized copy of %s: %s", gguf, exc)
        return None
    if copy is None:
        return None
    tensors = {tensor.data_ptr(): tensor for tensor in model.state_dict().values()}  # tied: once
    size = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
    if size > MAX_BYTES:
        logger.info(
            "Not keeping a de-quantized copy of %s: its weights take %.1f GiB, above the %.0f GiB a copy "
            "may take; each load de-quantizes the file again",
            gguf,
            size / 2**30,
            MAX_BYTES / 2**30,
        )
        return None
    folder = copy.parent
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        _remove_abandoned(folder)
        written = Path(tempfile.mkdtemp(prefix=_WRITING, dir=folder))
    except OSError as exc:
        logger.warning("Could not keep a de-quantized copy of %s in %s: %s", gguf, folder, exc)
        return None
    try:
        kept = _write(written, gguf, model, tokenizer)
        os.rename(written, copy)  # whole or not at all; another replica may have won
    except Exception as exc:  # noqa: BLE001 - the model is loaded: a copy not kept is only slower next time
        if isinstance(exc, OSError) and (raced := find(gguf, dtype)) is not None:
            return raced
        logger.warning("Could not keep a de-quantized copy of %s in %s: %s", gguf, folder, exc)
        return None
    finally:
        shutil.rmtree(written, ignore_errors=True)  # gone once renamed
    logger.info("Kept a de-quantized copy of %s in %s: the next load reads it", gguf, copy)
    return Copy(copy, kept)


def _untied(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The model's weights by name, a tied tensor once, under the input embeddings' name
    when it is theirs (a checkpoint's layout: vLLM reads a tied output layer from the
    embeddings and skips ``lm_head.weight``)."""
    layer = model.get_input_embeddings()
    preferred = next(f"{name}.weight" for name, module in model.named_modules() if module is layer)
    named: dict[object, tuple[str, torch.Tensor]] = {}
    for name, tensor in model.state_dict().items():
        # Tied: the same memory, shape and type; empty tensors share no memory.
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype) if tensor.numel() else name
        if key not in named or name == preferred:
            named[key] = (name, tensor)
    return {name: tensor.contiguous() for name, tensor in named.values()}


def _private(facts: os.stat_result) -> bool:
    return (
        stat.S_ISDIR(facts.st_mode)
        and facts.st_uid == os.getuid()
        and stat.S_IMODE(facts.st_mode) & 0o077 == 0
    )


def _remove_abandoned(folder: Path) -> None:
    """Folders left half-written by a process that died while writing (a replica stopped
    during its first load)."""
    now = time.time()
    for entry in folder.glob(f"{_WRITING}*"):
        try:
            if now - entry.lstat().st_mtime > _ABANDONED_AFTER_S:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue


def _write(folder: Path, gguf: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> str:
    """The copy's files in ``folder``, on disk before it is renamed; returns the weights'
    type."""
    from safetensors.torch import save_file  # transformers' own dependency

    # Not model.save_pretrained: transformers refuses it for a model read from GGUF. The
    # config is a plain checkpoint's: the weights are de-quantized, and vLLM finds the
    # model's class by the architecture it names.
    config = deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    save_file(_untied(model), str(folder / "model.safetensors"))
    tokenizer.save_pretrained(folder)
    kept = str(model.dtype).removeprefix("torch.")
    (folder / _ABOUT).write_text(json.dumps({"gguf": str(gguf), "dtype": kept}))
    for written in folder.iterdir():
        with written.open("rb") as file:
            os.fsync(file.fileno())
    return kept


def checkpoint(gguf: Path, dtype: str) -> tuple[Path, bool]:
    """A folder holding ``gguf`` de-quantized as a plain Hugging Face checkpoint, for an
    engine that reads only those (vLLM): the kept copy, made now if there is none; and
    whether the folder is the caller's to remove (True where no copy can be kept: the cache
    off, the weights too large, the disk refused; it is a new temporary folder then)."""
    found = find(gguf, dtype)
    if found is not None:
        return found.folder, False
    from transformers import AutoModelForCausalLM, AutoTokenizer

    files: FromPretrained = {"gguf_file": gguf.name, "local_files_only": True}
    weights = files.copy()
    if dtype != "auto":
        import torch

        weights["dtype"] = getattr(torch, dtype)
    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **files)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, **weights)
    logger.info("De-quantized %s in %.1f s", gguf, time.monotonic() - started)
    kept = store(gguf, dtype, model, tokenizer)
    if kept is not None:
        return kept.folder, False
    scratch = Path(tempfile.mkdtemp(prefix="app_toolkit-gguf-"))
    try:
        _write(scratch, gguf, model, tokenizer)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return scratch, True
