"""The console pipe: whole lines in, whole lines out; what does not fit comes back."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import threading
import time
from pathlib import Path

import pytest

from app_toolkit._runtime import console_pipe, log_format
from app_toolkit._runtime.console_pipe import ATOMIC, ConsolePipe, PipeWriter
from tests.waiting import wait_for


class _Console(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def write(self, data: bytes) -> int:  # type: ignore[override]
        with self.lock:
            return super().write(data)

    def text(self) -> str:
        with self.lock:
            return self.getvalue().decode()


def _lines(count: int, width: int = 60) -> str:
    return "".join(f"{index:08d} " + "x" * width + "\n" for index in range(count))


def test_lines_reach_the_console_whole_and_in_order() -> None:
    out = _Console()
    console = ConsolePipe(out)
    try:
        writer = PipeWriter(console.path)
        text = _lines(3000)  # 216 KB: more than the pipe holds at once
        left = text
        deadline = time.monotonic() + 10
        while left:  # the reader drains while we write; what did not fit is written again
            assert time.monotonic() < deadline, "the console stopped reading"
            left = writer.write(left)
        wait_for(lambda: out.text() == text, 10, "every line on the console")
        writer.close()
    finally:
        console.close()
    assert not os.path.exists(console.path)


def test_the_pipe_holds_several_batches_of_access_lines() -> None:
    # The kernel's 64 KiB is less than one batch at a few thousand requests a second; what
    # did not fit went through Ray's relay (three more processes per line).
    console = ConsolePipe(_Console())
    try:
        end = os.open(console.path, os.O_WRONLY | os.O_NONBLOCK)
        try:
            held = fcntl.fcntl(end, fcntl.F_GETPIPE_SZ)
        finally:
            os.close(end)
    finally:
        console.close()
    assert held == max(min(console_pipe.PIPE_BYTES, console_pipe._pipe_limit()), 64 << 10)


def test_a_full_pipe_gives_back_the_rest_from_a_line_start(tmp_path: Path) -> None:
    path = str(tmp_path / "pipe")
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        writer = PipeWriter(path)
        text = _lines(5000)  # 360 KB: the pipe (64 KiB) fills and nobody reads
        left = writer.write(text)
        written = text[: len(text) - len(left)]
        assert left and written.endswith("\n") and left[:8].isdigit()  # cut between lines
        got = b""
        while True:
            try:
                piece = os.read(reader, 1 << 16)
            except BlockingIOError:
                break
            if not piece:
                break
            got += piece
        assert got.decode() == written
        writer.close()
    finally:
        os.close(reader)


def test_a_line_longer_than_one_atomic_write_is_given_back(tmp_path: Path) -> None:
    out = _Console()
    console = ConsolePipe(out)
    try:
        writer = PipeWriter(console.path)
        long_line = "y" * (ATOMIC + 10) + "\n"
        assert writer.write("short\n" + long_line + "after\n") == long_line + "after\n"
        wait_for(lambda: out.text() == "short\n", 10, "the short line")
    finally:
        console.close()


def test_without_a_reader_every_line_is_given_back(tmp_path: Path) -> None:
    assert PipeWriter(str(tmp_path / "missing")).write("a\n") == "a\n"  # another node
    out = _Console()
    console = ConsolePipe(out)
    writer = PipeWriter(console.path)
    try:
        assert writer.write("before\n") == ""
        wait_for(lambda: out.text() == "before\n", 10, "the line")
    finally:
        console.close()  # the command stopped: its workers log the usual way again
    assert writer.write("after\n") == "after\n"
    assert writer.write("later\n") == "later\n"


def test_what_the_pipe_gives_back_goes_to_the_log_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.set_name("app_toolkit")
    handler.setFormatter(log_format._TextFormatter())
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])
    logger = logging.getLogger("app_toolkit.test_console_pipe")
    writer = log_format.batch_writer(logger)
    assert writer is not None
    monkeypatch.setattr(console_pipe, "_writer", PipeWriter("/nonexistent/pipe"))  # no reader
    writer.write("INFO", [(time.time(), "one line", {}), (time.time(), "another", {})])
    lines = stream.getvalue().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == ["one line", "another"]


def test_the_writer_is_named_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console_pipe, "_writer", None)
    monkeypatch.delenv(console_pipe.PIPE_ENV, raising=False)
    assert console_pipe.writer() is None
    monkeypatch.setenv(console_pipe.PIPE_ENV, "/nonexistent/pipe")
    made = console_pipe.writer()
    assert made is not None and made is console_pipe.writer()
    assert made.write("x\n") == "x\n"


def test_no_pipe_when_standard_error_is_not_the_process_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # A notebook's or a capturing runner's stream: Ray's forwarding is what shows lines there.
    monkeypatch.setattr(console_pipe, "_console", None)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert console_pipe.for_workers() is None
    assert console_pipe._console is None
