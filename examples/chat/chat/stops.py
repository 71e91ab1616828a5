"""Stop sequences: cut a stream of text at the first stop string, even across pieces."""

from __future__ import annotations


class StopFilter:
    """Feed text pieces; get back the text that is safe to send.

    Text that could be the start of a stop string is held back until the next piece
    shows whether it is one.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        text = self._held + piece
        cut = min((index for index in (text.find(stop) for stop in self._stops) if index >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._held = True, ""
            return text[:cut]
        keep = max((_overlap(text, stop) for stop in self._stops), default=0)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What is still held when the stream ends without a stop."""
        held, self._held = self._held, ""
        return "" if self.stopped else held


def _overlap(text: str, stop: str) -> int:
    """Length of the longest end of ``text`` that begins ``stop``."""
    for size in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-size:]):
            return size
    return 0
