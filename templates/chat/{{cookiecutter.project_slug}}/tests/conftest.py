"""Fixtures: the app on the in-process backend, with the deterministic echo model."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Ray's worker processes import this project's modules by name, like this process does.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import app_toolkit as tk  # noqa: E402

from {{ cookiecutter.package_name }}.app import build_app  # noqa: E402
from {{ cookiecutter.package_name }}.settings import Settings  # noqa: E402

#: 200 words a second: fast tests, yet slow enough to stop a reply half way.
ECHO = Settings(backend="echo", echo_tokens_per_s=200)


@pytest.fixture(scope="module")
def client() -> Iterator[tk.testing.TestClient]:
    with tk.testing.TestClient(build_app(ECHO)) as client:
        yield client


def chat(text: str, **options: object) -> dict[str, object]:
    """An OpenAI chat request with one user message."""
    return {"model": "echo", "messages": [{"role": "user", "content": text}], **options}
