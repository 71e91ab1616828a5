"""The key/value cache of the replies a decoder runs together: one row per reply, left-
padded to the longest, with the mask of the positions each row holds and each row's
newest token (what the next decoding step reads). Rows join with their prompt's cache and
leave when their reply ends; a step grows every row by one position, or is undone.

Also transformers' names for the cache, which moved in 5.24 (:func:`cache_argument`,
:func:`cache_of`).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Protocol, cast

import torch
from transformers import DynamicCache

from .prefix_cache import LayerKV


class CacheLayer(Protocol):
    """One layer of a key/value cache: its keys and values, ``[rows, heads, positions, head_dim]``."""

    @property
    def keys(self) -> torch.Tensor: ...

    @property
    def values(self) -> torch.Tensor: ...


class KVCache(Protocol):
    """What the decoder reads and writes of transformers' ``DynamicCache``: a layer of keys
    and values per attention layer of the model."""

    @property
    def layers(self) -> Sequence[CacheLayer]: ...

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def batch_select_indices(self, indices: torch.Tensor) -> None: ...


class ForwardOutput(Protocol):
    """What the decoder reads of a forward pass's output (transformers'
    ``CausalLMOutputWithPast``)."""

    @property
    def logits(self) -> torch.Tensor: ...

    @property
    def past_key_values(self) -> KVCache: ...  # transformers 5.24 on: ``cache`` (:func:`cache_of`)


class BatchCache:
    """The rows' keys and values (a ``DynamicCache``), mask and newest tokens."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.cache: KVCache | None = None  # the rows', left-padded
        self.mask = torch.zeros(0, 0, dtype=torch.long)  # 1 where a row has a token
        self.last = torch.zeros(0, 1, dtype=torch.long)  # each row's newest token

    def add(self, cache: KVCache, length: int, token: int) -> None:
        """A new last row: a prompt's cache of ``length`` positions, and its first token."""
        if self.cache is None:
            self.cache, self.mask = cache, torch.ones(1, length, dtype=torch.long)
            self.last = torch.tensor([[token]])
            return
        width = max(self.mask.shape[1], length)
        merged = _empty_cache()
        for index, (old, new) in enumerate(zip(self.cache.layers, cache.layers, strict=True)):
            keys = torch.cat([_left_pad(old.keys, width), _left_pad(new.keys, width)])
            values = torch.cat([_left_pad(old.values, width), _left_pad(new.values, width)])
            merged.update(keys, values, index)
        self.cache = merged
        mask = torch.zeros(self.mask.shape[0] + 1, width, dtype=torch.long)
        mask[:-1, width - self.mask.shape[1] :] = self.mask
        mask[-1, width - length :] = 1
        self.mask = mask
        self.last = torch.cat([self.last, torch.tensor([[token]])])

    def keep(self, rows: list[int]) -> None:
        """Only ``rows`` stay (in order); columns that are padding in every row go."""
        if not rows:
            self.reset()
            return
        assert self.cache is not None  # rows are held: add() set it
        self.cache.batch_select_indices(torch.tensor(rows))
        self.mask, self.last = self.mask[rows], self.last[rows]
        start = int(self.mask.any(dim=0).nonzero()[0])
        if start:
            self.cache = _sliced(self.cache, start)
            self.mask = self.mask[:, start:]

    def row(self, row: int) -> tuple[int, list[LayerKV]]:
        """How many positions row ``row`` holds, and their keys and values: views of the
        batch's tensors (copy them before keeping them: a view holds the whole batch)."""
        width = int(self.mask[row].sum())
        assert self.cache is not None  # the row is held: add() set it
        layers = [
            (layer.keys[row : row + 1, :, -width:], layer.values[row : row + 1, :, -width:])
            for layer in self.cache.layers
        ]
        return width, layers

    def step_inputs(self, cache_argument: str) -> tuple[dict[str, object], int]:
        """A decoding step's forward arguments (the mask grown by one position), and the
        width to undo it to (:meth:`undo`)."""
        positions = self.mask.sum(dim=1, keepdim=True)  # each row's own length so far
        width = self.mask.shape[1]
        self.mask = torch.cat([self.mask, torch.ones(self.mask.shape[0], 1, dtype=torch.long)], dim=1)
        inputs: dict[str, object] = {
            "input_ids": self.last,
            "attention_mask": self.mask,
            "position_ids": positions,
            "use_cache": True,
            cache_argument: self.cache,
        }
        return inputs, width

    def undo(self, width: int) -> None:
        """Cut the cache and the mask back to ``width`` positions (a step stopped mid-pass)."""
        assert self.cache is not None  # a step ran: add() set it
        self.cache = _cut(self.cache, width)
        self.mask = self.mask[:, :width]

    def stepped(self, cache: KVCache, tokens: Sequence[int]) -> None:
        """A step's cache, and each row's new token (a row that ends feeds any token)."""
        self.cache = cache
        self.last = torch.tensor([[max(token, 0)] for token in tokens])


def cache_argument(model: torch.nn.Module) -> str:
    """The forward keyword that takes the key/value cache: transformers 5.24 renamed
    ``past_key_values`` to ``cache`` (the old name warns, and goes in 5.40). A peft model
    passes it on to the model it wraps."""
    unwrap = getattr(model, "get_base_model", None)  # a peft model's (torch types no such method)
    base = model if unwrap is None else unwrap()
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def cache_of(output: ForwardOutput) -> KVCache:
    """A forward pass's cache (the field's name from transformers 5.24 on: ``cache``)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def cache_from(layers: Sequence[LayerKV]) -> KVCache:
    """A cache holding ``layers``' keys and values (copied: the cache grows its own)."""
    cache = _empty_cache()
    for index, (keys, values) in enumerate(layers):
        cache.update(keys, values, index)
    return cache


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(tensor, (0, 0, width - tensor.shape[2], 0))


def _empty_cache() -> KVCache:
    """A ``DynamicCache`` with no layers yet: each ``update`` adds one."""
    # cast: transformers types a cache's layers as any kind of layer (linear attention's have
    # no keys, a dummy one's are None); one that update() fills holds tensors in each.
    return cast(KVCache, DynamicCache())


def _cut(cache: KVCache, width: int) -> KVCache:
    """The cache's first ``width`` positions, in every layer (some may hold one more)."""
    kept = _empty_cache()
    for index, layer in enumerate(cache.layers):
        kept.update(layer.keys[:, :, :width], layer.values[:, :, :width], index)
    return kept


def _sliced(cache: KVCache, start: int) -> KVCache:
    trimmed = _empty_cache()
    for index, layer in enumerate(cache.layers):
        trimmed.update(layer.keys[:, :, start:], layer.values[:, :, start:], index)
    return trimmed
