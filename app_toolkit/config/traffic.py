"""The options of the traffic policies: a canary rollout's steps and bounds, a shadow's
share and comparison."""

from __future__ import annotations

from pydantic import Field, field_validator

from app_toolkit.config.schema import Strict
from app_toolkit.import_path import split_import_path


class RolloutOptions(Strict):
    """How a rollout goes: the one schema of its options (``rollout()``, ``app-toolkit
    rollout`` and the controller take their defaults and bounds from here)."""

    steps: tuple[float, ...] = Field(
        (1.0, 10.0, 50.0, 100.0), description="The canary's percentages of the traffic, step by step."
    )
    interval_s: float = Field(60.0, gt=0, description="Seconds each step lasts.")
    max_error_rate: float | None = Field(
        0.01,
        ge=0,
        lt=1,
        description="Roll back when more than this fraction of the canary's requests fail (None: never).",
    )
    max_p99_ms: float | None = Field(
        None, gt=0, description="Roll back when the canary's p99 latency exceeds this (None: never)."
    )

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: tuple[float, ...]) -> tuple[float, ...]:
        if not steps or any(not 0 < s <= 100 for s in steps) or list(steps) != sorted(set(steps)):
            raise ValueError("must be increasing percentages in (0, 100], like [1, 10, 50, 100]")
        return steps


class ShadowOptions(Strict):
    """How a shadow copies: the one schema of its options (``shadow()``, ``app-toolkit
    shadow``, config files and the controller take their defaults and bounds from here)."""

    fraction: float = Field(0.1, gt=0, le=1, strict=True, description="The share of requests copied.")
    compare: str = Field(
        "",
        description='The import path ("module:function" or "module.function") of a function '
        'saying whether two answers agree; "" compares statuses only.',
    )

    @field_validator("compare")
    @classmethod
    def _names_a_function(cls, compare: str) -> str:
        if compare:
            split_import_path(compare)
        return compare
