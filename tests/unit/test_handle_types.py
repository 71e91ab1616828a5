"""Streaming handles stay streaming. (What mypy infers for remote() is checked in
static_types.py, by mypy.)"""

from __future__ import annotations

import pickle

import app_toolkit as tk
from app_toolkit.handle import StreamingDeploymentHandle


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
