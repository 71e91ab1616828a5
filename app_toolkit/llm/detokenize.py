"""From token ids to text as a reply streams: every engine user turns the ids an engine
yields into text pieces here, and cuts them at stop strings.

:class:`Detokenizer` decodes a small window of tokens per new token (never the whole reply
again), and holds a piece back while it ends in half a multi-byte character.
:class:`StopFilter` holds back text that may begin a stop string until the next piece
shows whether it does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

#: What ``bytes.decode(errors="replace")`` and the Hugging Face tokenizers put where a
#: multi-byte character is cut: the rest of it is in the next token.
REPLACEMENT = "\ufffd"


class Detokenizer:
    """Feed token ids one by one; get the text each adds (often "" while a character is
    incomplete).

    ``decode`` is the engine's (special tokens skipped, or their text kept: vLLM's
    ``skip_special_tokens``). ``context`` is a few tokens before the reply (the prompt's
    last ones): decoded with the first tokens, they keep a leading space that a tokenizer
    drops at the start of a text.

    ``unspaced`` (vLLM's ``spaces_between_special_tokens`` false, special tokens kept): the
    model's added tokens by id, with their text. One that comes right after another is
    sent as its text alone, without the space a tokenizer's decoder may put between them
    (WordPiece's does; byte-level BPE's puts none), as vLLM's detokenizer sends it.

    Each token costs two decodes of the window since the last piece sent (the algorithm
    of text-generation-inference and vLLM), so a reply costs O(its tokens).
    """

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        context: Sequence[int] = (),
        *,
        unspaced: Mapping[int, str] | None = None,
    ) -> None:
        self._decode = decode
        self._tokens: list[int] = list(context)
        # _tokens[_start:_sent] is text already sent, decoded again as the next piece's context;
        # _tokens[_sent:] is not sent yet.
        self._start = 0
        self._sent = len(self._tokens)
        self._unspaced = unspaced or {}
        self._after_unspaced = False  # the last token fed was one of them (the prompt's are not)

    def feed(self, token_id: int) -> str:
        """The text ``token_id`` completes ("" while it ends in half a character)."""
        alone = self._sent == len(self._tokens)  # nothing held back: the piece is this token's
        self._tokens.append(token_id)
        piece = self._advance(final=False)
        if self._unspaced:
            own = self._unspaced.get(token_id)
            if own is not None and self._after_unspaced and alone and piece:
                piece = own
            self._after_unspaced = own is not None
        return piece

    def flush(self) -> str:
        """What is still held when the reply ends: a cut character, as U+FFFD."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._sent == len(self._tokens):
            return ""
        before = self._decode(self._tokens[self._start : self._sent])
        after = self._decode(self._tokens[self._start :])
        if (after.endswith(REPLACEMENT) and not final) or len(after) <= len(before):
            return ""  # half a character, or a token with no text of its own yet
        self._start, self._sent = self._sent, len(self._tokens)
        del self._tokens[: self._start]  # the window is all the next tokens need
        self._sent -= self._start
        self._start = 0
        return after[len(before) :]


class StopFilter:
    """Feed text pieces; get back the text that is safe to send.

    Text that could be the start of a stop string is held back until the next piece
    shows whether it is one; once one is found, ``stopped`` is True and nothing more is
    sent: the stop string neither, unless ``include`` (vLLM's ``include_stop_str_in_output``).
    """

    def __init__(self, stops: Sequence[str], include: bool = False) -> None:
        self._stops = tuple(stop for stop in stops if stop)
        self._include = include
        self._held = ""
        self.stopped = False
        #: The stop string that ended the text (None: none did).
        self.found: str | None = None

    def feed(self, piece: str, matching: bool = True) -> str:
        """The part of ``piece`` (after what was held) that is safe to send now; with
        ``matching`` False (the reply is not yet ``min_tokens`` long), all of it: a stop
        string counts only in text after that, as in vLLM."""
        if self.stopped:
            return ""
        text = self._held + piece
        if not matching:
            self._held = ""
            return text
        # The one that ends first (ties: the first listed), as vLLM picks it.
        found = [
            (index + len(stop), order, index, stop)
            for order, stop in enumerate(self._stops)
            if (index := text.find(stop)) >= 0
        ]
        if found:
            _, _, cut, stop = min(found)
            self.found, self.stopped, self._held = stop, True, ""
            return text[: cut + len(stop)] if self._include else text[:cut]
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
