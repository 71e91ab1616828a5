"""Fixtures: the app on the in-process backend."""

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


@pytest.fixture
def client() -> Iterator[tk.testing.TestClient]:
    with tk.testing.TestClient(build_app(Settings(greeting="Hi"))) as client:
        yield client
