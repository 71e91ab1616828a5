"""The key/value cache of sequences read before, so that a prompt that starts like one of
them reads only what follows (vLLM's automatic prefix caching, on whole sequences).

An entry is one sequence's keys and values in every layer: a prompt once read, or a reply's
prompt and tokens once it ends (the next turn of a chat starts with both). A new prompt
reuses the longest prefix it shares with any entry of the same adapter (a LoRA adapter on
the attention changes the keys and values, so each adapter has entries of its own), less
its last token, whose logits the reply's first token needs. Entries are bounded in bytes
and evicted least recently used; an entry that is a prefix of a newer one is dropped, as
the newer one holds it.

Pure bookkeeping around tensors: no model, no event loop. The decoder calls it from the
thread its forward passes run in, one call at a time.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from app_toolkit.request_router.shared_prefix import shared_prefix

#: One layer's keys and values, each ``[1, heads, tokens, head_dim]``.
LayerKV = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True, slots=True)
class Found:
    """What a lookup found: ``tokens`` of the prompt are cached, and ``layers`` holds
    their keys and values (empty when none are)."""

    tokens: int
    layers: tuple[LayerKV, ...] = ()


@dataclass(frozen=True, slots=True)
class _Entry:
    tokens: tuple[int, ...]
    layers: tuple[LayerKV, ...]
    size: int  # bytes


class PrefixCache:
    """Sequences' keys and values by adapter and tokens, at most ``max_bytes`` in all.

    Counts what it served: ``queried`` prompt tokens looked up, ``hit`` of them found.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 (0: cache nothing), got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[tuple[str, tuple[int, ...]], _Entry] = (
            collections.OrderedDict()
        )
        self.size = 0
        self.queried = 0
        self.hit = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: Sequence[int], adapter: str = "") -> Found:
        """The longest cached prefix of ``prompt`` (at most all but its last token) under
        ``adapter``, with its keys and values; the entry it came from becomes the most
        recently used."""
        self.queried += len(prompt)
        best: tuple[str, tuple[int, ...]] | None = None
        longest = 0
        wanted = len(prompt) - 1
        tokens = tuple(prompt)
        for key, entry in self._entries.items():
            if key[0] != adapter or longest >= wanted:
                continue
            shared = shared_prefix(entry.tokens, tokens, wanted)
            if shared > longest:
                best, longest = key, shared
        if best is None:
            return Found(0)
        self._entries.move_to_end(best)
        self.hit += longest
        layers = tuple(
            (keys[:, :, :longest], values[:, :, :longest]) for keys, values in self._entries[best].layers
        )
        return Found(longest, layers)

    def store(self, tokens: Sequence[int], layers: Sequence[LayerKV], adapter: str = "") -> bool:
        """Keep the keys and values of ``tokens`` (each layer's ``[1, heads, len(tokens),
        head_dim]``, not changed in place afterwards). False: too large for the cache, or
        already held by an entry it is a prefix of."""
        held = tuple(tokens)
        if not held:
            return False
        size = sum(keys.nbytes + values.nbytes for keys, values in layers)
        if size > self.max_bytes:
            return False
        for other_adapter, other in self._entries:
            if other_adapter == adapter and len(other) >= len(held) and other[: len(held)] == held:
                self._entries.move_to_end((other_adapter, other))
                return False
        for key in [k for k in self._entries if k[0] == adapter and held[: len(k[1])] == k[1]]:
            self._drop(key)  # a prefix of this one: held by it now
        self._entries[(adapter, held)] = _Entry(held, tuple(layers), size)
        self.size += size
        while self.size > self.max_bytes:
            self._drop(next(iter(self._entries)))
        return True

    def clear(self, adapter: str | None = None) -> None:
        """Forget every entry (of ``adapter`` only, when given: it was unloaded)."""
        for key in [k for k in self._entries if adapter is None or k[0] == adapter]:
            self._drop(key)

    def _drop(self, key: tuple[str, tuple[int, ...]]) -> None:
        self.size -= self._entries.pop(key).size
