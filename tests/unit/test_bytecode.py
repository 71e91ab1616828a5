"""The warning for a Ray install that every process compiles from source as it starts."""

from __future__ import annotations

import importlib.util
import logging
import py_compile
import sys
from pathlib import Path
from types import ModuleType

import pytest

from app_toolkit._runtime.backends.ray.bytecode import compiled, warn_if_compiled_at_each_start


def _import_fresh(folder: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_module_without_bytecode_is_named_with_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # PYTHONDONTWRITEBYTECODE
    (tmp_path / "uncompiled.py").write_text("VALUE = 1\n")
    module = _import_fresh(tmp_path, "uncompiled")
    assert not compiled(module)
    with caplog.at_level(logging.WARNING, logger="app_toolkit.ray"):
        warn_if_compiled_at_each_start(module)
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("uncompiled's modules have no bytecode here")
    assert importlib.util.cache_from_source(str(tmp_path / "uncompiled.py")) in message
    assert "uv pip install --compile-bytecode" in message


def test_no_warning_once_compiled_or_with_nothing_to_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    source = tmp_path / "compiled_ahead.py"
    source.write_text("VALUE = 2\n")
    py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)), doraise=True)
    with caplog.at_level(logging.WARNING, logger="app_toolkit.ray"):
        warn_if_compiled_at_each_start(_import_fresh(tmp_path, "compiled_ahead"))
        warn_if_compiled_at_each_start(sys)  # built in: no source file
    assert caplog.records == []


def test_no_warning_where_the_first_process_writes_the_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    (tmp_path / "written_later.py").write_text("VALUE = 3\n")
    module = _import_fresh(tmp_path, "written_later")
    assert not compiled(module)
    # A process allowed to write it, in a folder it may write to (tmp_path): the cluster's
    # first worker writes it, and the others read it.
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    with caplog.at_level(logging.WARNING, logger="app_toolkit.ray"):
        warn_if_compiled_at_each_start(module)
    assert caplog.records == []
