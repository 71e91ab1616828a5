"""The prefix cache's bookkeeping: the longest shared prefix under the same adapter (never
a prompt's last token), entries that hold others, the byte bound, least recently used
first out, and the counts it reports."""

from __future__ import annotations

import pytest
import torch

from app_toolkit.llm.engines.prefix_cache import PrefixCache

LAYERS = 2


def kv(tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values whose every position holds its token id (a slice shows which)."""
    column = torch.tensor(tokens, dtype=torch.float32).view(1, 1, -1, 1).expand(1, 2, -1, 4).contiguous()
    return [(column, column + 0.5) for _ in range(LAYERS)]


def entry_bytes(length: int) -> int:
    return LAYERS * 2 * 2 * length * 4 * 4  # layers, keys and values, heads, tokens, head_dim, float32


def test_the_longest_shared_prefix_is_found_with_its_keys_and_values() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    assert cache.store([1, 2, 3, 4, 5], kv([1, 2, 3, 4, 5]))
    assert cache.store([1, 2, 9], kv([1, 2, 9]))
    found = cache.lookup([1, 2, 3, 4, 7, 8])
    assert found.tokens == 4
    keys, values = found.layers[0]
    assert keys.shape == (1, 2, 4, 4) and keys[0, 0, :, 0].tolist() == [1, 2, 3, 4]
    assert values[0, 1, :, 0].tolist() == [1.5, 2.5, 3.5, 4.5]
    # A prompt the cache holds whole still reads its last token (its logits start the reply).
    assert cache.lookup([1, 2, 3, 4, 5]).tokens == 4
    assert cache.lookup([7, 1, 2]).tokens == 0 and cache.lookup([7, 1, 2]).layers == ()
    assert cache.lookup([1]).tokens == 0
    assert (cache.queried, cache.hit) == (6 + 5 + 3 + 3 + 1, 4 + 4)


def test_an_adapter_finds_only_its_own_entries() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    cache.store([1, 2, 3, 4], kv([1, 2, 3, 4]), adapter="legal")
    assert cache.lookup([1, 2, 3, 4, 5]).tokens == 0  # the base model's keys differ
    assert cache.lookup([1, 2, 3, 4, 5], adapter="legal").tokens == 4
    cache.store([1, 2, 3], kv([1, 2, 3]))
    cache.clear(adapter="legal")  # unloaded: its entries go, the others stay
    assert cache.lookup([1, 2, 3, 4], adapter="legal").tokens == 0 and len(cache) == 1


def test_an_entry_holding_another_replaces_it_and_a_held_one_is_not_stored() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    cache.store([1, 2], kv([1, 2]))
    assert cache.store([1, 2, 3, 4], kv([1, 2, 3, 4]))  # the next turn: prompt and reply
    assert len(cache) == 1 and cache.size == entry_bytes(4)
    assert not cache.store([1, 2, 3], kv([1, 2, 3]))  # held by the longer one
    assert len(cache) == 1


def test_the_byte_bound_evicts_the_least_recently_used() -> None:
    cache = PrefixCache(max_bytes=entry_bytes(8))
    cache.store([1, 1, 1], kv([1, 1, 1]))
    cache.store([2, 2, 2], kv([2, 2, 2]))
    cache.lookup([1, 1, 1, 5])  # the first is now the most recently used
    cache.store([3, 3, 3], kv([3, 3, 3]))  # 9 tokens' worth: the second goes
    assert cache.lookup([2, 2, 2, 5]).tokens == 0
    assert cache.lookup([1, 1, 1, 5]).tokens == 3 and cache.lookup([3, 3, 3, 5]).tokens == 3
    assert cache.size == entry_bytes(6) <= cache.max_bytes
    assert not cache.store(list(range(9)), kv(list(range(9))))  # larger than the whole cache
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        PrefixCache(-1)
