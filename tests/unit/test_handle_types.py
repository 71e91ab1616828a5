"""Handles are typed: remote() says what it returns, and streaming handles stay streaming."""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path

from mypy import api

import app_toolkit as tk
from app_toolkit.handle import StreamingDeploymentHandle

SNIPPET = """
import app_toolkit as tk

async def use(handle: tk.DeploymentHandle) -> None:
    reveal_type(handle.remote(1))
    reveal_type(handle.embed.remote("x"))
    streaming = handle.options(stream=True)
    reveal_type(streaming.remote())
    reveal_type(streaming.tokens.remote("x"))
    async for item in streaming.tokens.remote("x"):
        reveal_type(item)
    reveal_type(handle.options(method_name="embed"))

class Model: ...

def typed(model: tk.DeploymentHandle[Model]) -> None:
    reveal_type(model.options(stream=True))
"""


def test_remote_is_typed_for_unary_and_streaming_calls(tmp_path: Path) -> None:
    source = tmp_path / "typed_handles.py"
    source.write_text(textwrap.dedent(SNIPPET))
    out, _, _ = api.run(["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(source)])
    revealed = [
        line.split('Revealed type is "')[1].rstrip('"') for line in out.splitlines() if "Revealed" in line
    ]
    assert revealed == [
        "app_toolkit.handle.DeploymentResponse[Any]",
        "app_toolkit.handle.DeploymentResponse[Any]",
        "app_toolkit.handle.DeploymentResponseGenerator[Any]",
        "app_toolkit.handle.DeploymentResponseGenerator[Any]",
        "Any",
        "app_toolkit.handle.DeploymentHandle[Any]",  # a bare DeploymentHandle: strict mypy accepts it
        "app_toolkit.handle.StreamingDeploymentHandle[typed_handles.Model]",  # Ray Serve's annotation
    ], out


def test_streaming_handles_stay_streaming_through_options_and_pickling() -> None:
    handle = tk.DeploymentHandle("Tokens", "app")
    streaming = handle.options(stream=True)
    assert isinstance(streaming, StreamingDeploymentHandle) and streaming.stream
    renamed = streaming.options(method_name="forever")
    assert isinstance(renamed, StreamingDeploymentHandle) and renamed.method_name == "forever"
    assert type(streaming.options(stream=False)) is tk.DeploymentHandle
    clone = pickle.loads(pickle.dumps(renamed))
    assert isinstance(clone, StreamingDeploymentHandle) and clone.method_name == "forever"
    assert type(pickle.loads(pickle.dumps(handle))) is tk.DeploymentHandle
