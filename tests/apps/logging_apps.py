"""A deployment that logs at two levels on every request (per-deployment logging_config)."""

from __future__ import annotations

import logging

import app_toolkit as tk

logger = logging.getLogger("tests.speaker")


@tk.deployment
class Speaker:
    """Logs "<word> speaks at info" and "<word> speaks at warning", then answers its word."""

    def __init__(self, word: str) -> None:
        self.word = word

    def __call__(self) -> str:
        logger.info("%s speaks at info", self.word)
        logger.warning("%s speaks at warning", self.word)
        return self.word
