"""Key/value caches kept across batches while the weights stay, so the CPU engine computes no prompt token
twice.

A rollout's prompts repeat themselves in two ways. Concurrent episodes of one domain start with the same
long system prompt (the domain policy and the tool schemas), and each episode's next prompt is its last
prompt, the reply drawn for it, and the new tool result. `KVStore` keeps the key/value cache of both:

- the shared prefix of a batch, computed once at batch size 1 when the batch's prompts share at least
  `min_shared` tokens and nothing kept covers them;
- the longest prompt of a few that share more than the whole batch does (the turns of one conversation
  asked at once; the episodes of one task), computed first at batch size 1 from what it reuses, so the
  others take their shared start from it (prompts with many more new tokens than the rest and no such
  partner are computed alone too, but not kept: see `KVStore.alone_cost`);
- with `turns`, every row's prompt and reply, taken from the batch's cache as the row finishes, so the
  episode's next turn prefills only the tokens that follow what was kept.

Each prompt reuses the kept entry that shares the longest prefix with it (a re-rendered conversation may
tokenize its last reply differently, so the match need not cover the whole entry); `KVStore.reuse` says
what each prompt of a batch takes (a `Reuse`), and `sessionrl.policy.kvcache` lays them out as the batch's
cache. Entries are evicted least recently used first once they hold more than `max_tokens` tokens; an
episode's entry is dropped once its next turn's batch has copied it (`KVStore.settle`), and a finished row
is kept as it leaves, so no more than the store holds is ever copied out of a batch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sessionrl.policy.kvcache import KV, batch_cache, packed


def common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix every prompt starts with.

    >>> common_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]])
    2
    """
    first = prompts[0]
    n = min(len(p) for p in prompts)
    for i in range(n):
        if any(p[i] != first[i] for p in prompts):
            return i
    return n


def shared_length(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading ids two id arrays share.

    >>> shared_length(np.array([1, 2, 3]), np.array([1, 2, 4, 5]))
    2
    """
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


@dataclass(eq=False)
class Kept:
    """The key/value cache of one token sequence."""

    ids: np.ndarray
    kv: KV
    shared: bool
    """A batch's shared prefix (kept for later batches), not one episode's turn."""


@dataclass(eq=False)
class KVStore:
    """Key/value caches kept across batches for one version of the weights (see the module doc)."""

    max_tokens: int = 65536
    """Most tokens kept over all entries (least recently used entries go first): 3 GB for SmolLM2-135M in
    float32 (1.5 GB in bfloat16), room for 16 to 20 episodes of 3 to 4k tokens, so that none of them
    prefills its whole conversation again (docs/engines.md)."""
    min_shared: int = 64
    """Shortest shared prefix worth computing once for a batch."""
    alone_cost: int = 256
    """What prefilling one prompt alone, at batch size 1, costs beyond its own tokens, in prompt tokens
    (the pass reads every weight once more). The batch pads every row to its longest remainder, so its
    longest prompts are prefilled alone first where that costs less than the padding (`alone_rows`)."""
    turns: bool = True
    """Keep each row's prompt and reply for the episode's next turn (else only shared prefixes)."""
    dtype: torch.dtype | None = None
    """What the caches are kept in; None: the model's dtype. Narrower (bfloat16 under a float32 model)
    halves their memory and what a decode step reads, and needs an attention that reads it
    (`sessionrl.policy.attention`)."""
    entries: OrderedDict[tuple[int, ...], Kept] = field(default_factory=OrderedDict)
    builds: int = 0
    """Shared prefixes computed so far."""
    alone: int = 0
    """Prompts prefilled alone (`alone_cost`) so far, shared prefixes aside."""
    hits: int = 0
    """Prompts that reused a kept entry."""
    reused_tokens: int = 0
    """Prompt tokens taken from kept entries instead of prefilled."""
    prefilled_tokens: int = 0
    """Prompt tokens prefilled."""
    evicted: int = 0
    """Entries dropped (or never kept) to stay within `max_tokens`."""

    @property
    def tokens(self) -> int:
        """Tokens kept now over all entries."""
        return sum(len(e.ids) for e in self.entries.values())

    def clear(self) -> None:
        """Forget every entry (the weights changed)."""
        self.entries.clear()

    def admits(self, tokens: int) -> bool:
        """Whether an entry of `tokens` tokens fits within `max_tokens` at all (counted as evicted if not)."""
        if tokens > self.max_tokens:
            self.evicted += 1
            return False
        return True

    def longest(self, prompt: np.ndarray) -> tuple[int, tuple[int, ...] | None]:
        """The entry sharing the longest prefix with `prompt` (leaving it at least one token) and how many
        tokens it shares; ``(0, None)`` when none does."""
        best, key = 0, None
        for k, entry in self.entries.items():
            n = min(shared_length(entry.ids, prompt), len(prompt) - 1)
            if n > best:
                best, key = n, k
        return best, key

    def put(self, ids: Sequence[int], kv: KV, *, shared: bool) -> tuple[int, ...] | None:
        """Keep `kv` as the cache of `ids` (most recently used); its key, or None when it alone would
        exceed `max_tokens`."""
        key = tuple(ids)
        if not self.admits(len(key)):
            return None
        self.entries[key] = Kept(np.asarray(key, dtype=np.int64), kv, shared)
        self.entries.move_to_end(key)
        total = self.tokens
        while total > self.max_tokens:
            _, dropped = self.entries.popitem(last=False)
            total -= len(dropped.ids)
            self.evicted += 1
        return key

    def reuse(self, model: Any, prompts: Sequence[Sequence[int]]) -> list[Reuse]:
        """What each prompt takes from the kept entries; the batch's shared prefix is computed (and kept)
        first when it is long enough and no entry covers it for some row."""
        arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
        found = [self.longest(a) for a in arrays]
        taken = [Reuse(n, key, self.entries[key].kv if key is not None else None) for n, key in found]
        for key in {k for _, k in found if k is not None}:
            self.entries.move_to_end(key)
        if len(prompts) > 1:
            n = min(common_prefix(prompts), min(len(p) for p in prompts) - 1)
            if n >= self.min_shared and any(r.tokens < n for r in taken):
                kv = prefill(model, prompts[0][:n], dtype=self.dtype)
                shared = self.put(prompts[0][:n], kv, shared=True)
                self.builds += 1
                self.prefilled_tokens += n
                taken = [Reuse(n, shared, kv) if r.tokens < n else r for r in taken]
            taken = self._extended(model, arrays, taken)
        self.hits += sum(r.kv is not None for r in taken)
        self.reused_tokens += sum(r.tokens for r in taken)
        self.prefilled_tokens += sum(len(p) for p in prompts) - sum(r.tokens for r in taken)
        return taken

    def _extended(self, model: Any, prompts: Sequence[np.ndarray], taken: list[Reuse]) -> list[Reuse]:
        """Prompts computed first at batch size 1, from what they reuse, all but their last token:

        - where prompts of the batch share more than the whole batch does (the turns of one conversation,
          of which each prompt starts the next; the episodes of one task), the longest of them, kept: the
          others take from it what they share with it, at least `min_shared` tokens more than they had;
        - the prompts with so many more new tokens than the rest that the batch would cost more padded
          to them than they cost alone (`alone_rows`).

        Longest first, so one seed serves every prompt that starts it. The batch then prefills short
        remainders only, and its cache is as wide as its longest prompt."""
        taken = list(taken)
        alone = alone_rows(
            [len(p) - 1 - r.tokens for p, r in zip(prompts, taken, strict=True)], self.alone_cost
        )
        for i in sorted(range(len(prompts)), key=lambda i: -len(prompts[i])):
            seed = prompts[i][: len(prompts[i]) - 1]
            shares = {j: min(shared_length(seed, p), len(p) - 1) for j, p in enumerate(prompts) if j != i}
            gains = {j: n for j, n in shares.items() if n - taken[j].tokens >= self.min_shared}
            new = len(seed) - taken[i].tokens
            if new > 0 and (gains or i in alone):
                kv = prefill(model, seed, taken[i], self.dtype)
                # alone, it keeps the key of what it reused: that episode entry is settled as before
                key = self.put(seed.tolist(), kv, shared=True) if gains else taken[i].key
                self.builds += bool(gains)
                self.alone += not gains
                self.prefilled_tokens += new
                taken[i] = Reuse(len(seed), key, kv)
            for j, n in gains.items():
                taken[j] = Reuse(n, taken[i].key, taken[i].kv)
        return taken

    def settle(self, used: Sequence[Reuse]) -> None:
        """Drop the episode entries a batch extended (its rows keep their new turns instead)."""
        for key in {r.key for r in used if r.key is not None}:
            entry = self.entries.get(key)
            if entry is not None and not entry.shared:
                del self.entries[key]


def alone_rows(new: Sequence[int], cost: int) -> set[int]:
    """The rows of a batch to prefill alone, given each row's `new` tokens: padded together, every row
    costs as many as the longest row kept in the batch, and a row alone costs its own plus `cost`. The
    longest rows go first, as many as make the total least.

    >>> sorted(alone_rows([40, 50, 45, 300], cost=64))
    [3]
    >>> sorted(alone_rows([40, 50, 45, 60], cost=64))
    []
    """
    order = sorted((i for i in range(len(new)) if new[i] > 0), key=lambda i: -new[i])
    best, least, alone = 0, len(new) * (new[order[0]] if order else 0), 0
    for k, i in enumerate(order, start=1):
        alone += new[i] + cost
        total = alone + (len(new) - k) * (new[order[k]] if k < len(order) else 0)
        if total < least:
            best, least = k, total
    return set(order[:best])


@dataclass(frozen=True, slots=True)
class Reuse:
    """What one prompt of a batch takes from a `KVStore`: its first `tokens` tokens, cached in `kv` (the
    kept entry `key`)."""

    tokens: int
    key: tuple[int, ...] | None
    kv: KV | None


def prefill(
    model: Any, ids: Sequence[int] | np.ndarray, start: Reuse | None = None, dtype: torch.dtype | None = None
) -> KV:
    """The key/value cache of `ids` (in `dtype`, or the model's), computed at batch size 1 after the first
    `start.tokens` of them, which `start` holds (from the first token without it)."""
    device = next(model.parameters()).device
    kept = start.kv if start is not None else None
    done = start.tokens if start is not None and kept is not None else 0
    # room for exactly the new tokens (the first update of an empty cache allocates what it writes)
    room = len(ids) - done if done else 0
    cache = batch_cache([kept], [done], model.config.num_hidden_layers, room, dtype)
    new = torch.as_tensor(np.asarray(ids[done:], dtype=np.int64), device=device)[None]
    positions = torch.arange(done, done + new.shape[1], device=device)[None]
    out = model(input_ids=new, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
    return packed([(layer.keys[0], layer.values[0]) for layer in out.cache.layers])


__all__ = ["KVStore", "Kept", "Reuse", "alone_rows", "common_prefix", "prefill", "shared_length"]
