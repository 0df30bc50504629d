"""The store of kept key/value caches: each prompt takes the entry sharing the longest prefix with it, the
store stays within its bound least recently used first, and an episode's entry goes once its next turn
has taken it."""

from __future__ import annotations

import numpy as np
import torch

from sessionrl.policy.kvcache import KV
from sessionrl.policy.kvstore import KVStore, Reuse


def cache_of(tokens: int) -> KV:
    return ((torch.zeros(1, tokens, 2), torch.zeros(1, tokens, 2)),)


def test_a_prompt_takes_the_entry_it_shares_most_with_and_leaves_itself_a_token() -> None:
    store = KVStore()
    store.put([1, 2, 3], cache_of(3), shared=True)
    store.put([1, 2, 3, 4, 5], cache_of(5), shared=False)
    assert store.longest(np.array([1, 2, 3, 4, 9])) == (4, (1, 2, 3, 4, 5))
    # a prompt that an entry covers whole keeps its last token to prefill (its logits start the reply)
    assert store.longest(np.array([1, 2, 3])) == (2, (1, 2, 3))
    assert store.longest(np.array([7, 8])) == (0, None)


def test_the_store_evicts_least_recently_used_first_and_counts_what_it_cannot_hold() -> None:
    store = KVStore(max_tokens=8)
    first = store.put([1, 2, 3], cache_of(3), shared=True)
    second = store.put([4, 5, 6], cache_of(3), shared=True)
    store.entries.move_to_end(first)  # reused since: the second is now the least recent
    store.put([7, 8, 9], cache_of(3), shared=False)
    assert list(store.entries) == [first, (7, 8, 9)]
    assert second not in store.entries
    assert store.put(list(range(9)), cache_of(9), shared=False) is None  # alone over the bound
    assert (store.evicted, store.tokens) == (2, 6)


def test_settling_drops_the_episode_entries_a_batch_took_and_keeps_shared_prefixes() -> None:
    store = KVStore()
    shared = store.put([1, 2], cache_of(2), shared=True)
    turn = store.put([1, 2, 3, 4], cache_of(4), shared=False)
    store.settle([Reuse(2, shared, None), Reuse(3, turn, None), Reuse(0, None, None)])
    assert list(store.entries) == [shared]
