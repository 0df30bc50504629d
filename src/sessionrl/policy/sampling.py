"""The CPU engine: batched torch sampling that computes no prompt token twice while the weights stay.

A rollout's prompts repeat themselves in two ways. Concurrent episodes of one domain start with the same
long system prompt (the domain policy and the tool schemas), and each episode's next prompt is its last
prompt, the reply drawn for it, and the new tool result. `KVStore` keeps the key/value cache of both:

- the shared prefix of a batch, computed once at batch size 1 when the batch's prompts share at least
  `min_shared` tokens and nothing kept covers them;
- the longest prompt of a few that share more than the whole batch does (the turns of one conversation
  asked at once, as the per-turn tool accuracy asks them; the episodes of one task), computed first at
  batch size 1 from what it reuses, so the others take their shared start from it (a prompt with many
  new tokens and no such partner is computed alone too, but not kept: see `KVStore.min_alone`);
- with `turns`, every row's prompt and reply, taken from the batch's cache as the row finishes, so the
  episode's next turn prefills only the tokens that follow what was kept.

Each prompt reuses the kept entry that shares the longest prefix with it (a re-rendered conversation may
tokenize its last reply differently, so the match need not cover the whole entry). The batch is then
prefilled as one cache laid out right-aligned, each row's reused part followed by its new tokens:

    kept     [pad.. kv_0       ][pad suffix_0]    attention mask: 0 on pads
             [kv_1             ][  suffix_1  ]    positions: each row's suffix continues from its own
             [pad...... kv_2   ][.  suffix_2 ]    reused length (pads between are skipped)

and decoded, rows leaving the batch (and the cache) as they reach a stop token. The batch's cache keeps
room for the new tokens (`RoomyLayer`), so a decode step writes one position per layer in place rather than
copying the whole cache to append it (`DynamicLayer` concatenates), and rows that leave are closed up in
place, so the cache never exists twice. Entries are evicted least recently used first once they hold more
than `max_tokens` tokens; an episode's entry is dropped once its next turn's batch has copied it, and a
finished row is kept as it leaves, so no more than the store holds is ever copied out of a batch.
`TorchEngine.refresh` (a new policy version) clears them all: nothing computed by older weights is reused.

Everything runs under `torch.inference_mode`. On a CPU with bfloat16 matrix units (AMX, AVX512-BF16),
the float32 model's linear layers but the output head are multiplied in bfloat16
(`sessionrl.policy.products.BF16Matmuls`). The caches are kept in the model's dtype and read by its own
attention (SDPA by default), or, asked for (`KVStore.dtype`; `batching.kv_cache: bfloat16` in a run's
config), in bfloat16, read by the attention of `sessionrl.policy.attention`. docs/engines.md measures
what each costs in time and logprobs.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from sessionrl.policy.attention import use_kept_attention
from sessionrl.policy.engine import Completion
from sessionrl.policy.memory import give_back_freed
from sessionrl.policy.products import BF16Matmuls, bf16_by_default

if TYPE_CHECKING:
    from sessionrl.policy.llm import SamplingConfig

KV = tuple[tuple[Tensor, Tensor], ...]
"""One key and one value tensor ``[heads, T, head_dim]`` per layer."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One sampled reply: its token ids and the log-probability of each under the sampling distribution."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Rows padded on the left to one length: ``(ids [B, T], attention_mask [B, T])``.

    >>> ids, mask = left_pad([[5, 6], [7]], pad_id=0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6], [0, 7]], [[1, 1], [0, 1]])
    """
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids, mask


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
    min_alone: int = 256
    """New tokens from which a prompt of a batch is prefilled alone, at batch size 1, before the batch:
    prefilled together, every row would be padded to its length."""
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
    """Prompts prefilled alone (`min_alone`) so far, shared prefixes aside."""
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
        - a prompt with `min_alone` new tokens or more, which the batch would pad every row to.

        Longest first, so one seed serves every prompt that starts it. The batch then prefills short
        remainders only, and its cache is as wide as its longest prompt."""
        taken = list(taken)
        for i in sorted(range(len(prompts)), key=lambda i: -len(prompts[i])):
            seed = prompts[i][: len(prompts[i]) - 1]
            shares = {j: min(shared_length(seed, p), len(p) - 1) for j, p in enumerate(prompts) if j != i}
            gains = {j: n for j, n in shares.items() if n - taken[j].tokens >= self.min_shared}
            new = len(seed) - taken[i].tokens
            if new > 0 and (gains or new >= self.min_alone):
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


def extend_batch(
    suffixes: Sequence[Sequence[int]], reused: Sequence[int], pad_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """New tokens padded on their left to one width ``W``, after kept caches of `reused` tokens laid out
    right-aligned over ``N = max(reused)`` slots: ``(ids [B, W], attention_mask [B, N + W], positions
    [B, W])``; each row's positions continue from its own reused length.

    >>> ids, mask, pos = extend_batch([[7, 8], [9]], reused=[2, 1], pad_id=0)
    >>> ids.tolist(), mask.tolist(), pos.tolist()
    ([[7, 8], [0, 9]], [[1, 1, 1, 1], [0, 1, 0, 1]], [[2, 3], [1, 1]])
    """
    width, slots = max(len(s) for s in suffixes), max(reused)
    ids = torch.full((len(suffixes), width), pad_id, dtype=torch.long)
    own = torch.zeros((len(suffixes), width), dtype=torch.long)
    kept = torch.zeros((len(suffixes), slots), dtype=torch.long)
    for i, (row, n) in enumerate(zip(suffixes, reused, strict=True)):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        own[i, width - len(row) :] = 1
        kept[i, slots - n :] = 1
    positions = torch.tensor(list(reused))[:, None] + (own.cumsum(-1) - 1).clamp_min(0)
    return ids, torch.cat([kept, own], dim=-1), positions


class RoomyLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A cache layer whose keys and values live in buffers with room for more tokens, so a decode step
    writes its token in place where `DynamicLayer` copies the whole layer (`torch.cat`) to append it; a
    full buffer doubles. `keys` and `values` are views of the filled part.

    With `dtype` narrower than the model computes in (bfloat16 under float32), the buffers hold that
    dtype, and a decode step's `update` (one new position) hands the attention the whole buffers, room
    included and zeroed, for `sessionrl.policy.attention.kept_or_sdpa` to read as far as the mask goes:
    bfloat16 products are fast on contiguous memory only. Otherwise it hands over the filled part."""

    def __init__(self, room: int, dtype: torch.dtype | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.room = room
        self.dtype = dtype
        """The buffers' dtype; None: the keys' own."""
        self.length = 0
        self.buffers: tuple[Tensor, Tensor] | None = None

    def hold(self, keys: Tensor, values: Tensor, length: int) -> None:
        """Start from buffers ``[B, heads, capacity, head_dim]`` whose first `length` positions are filled."""
        self.buffers, self.length = (keys, values), length
        self.lazy_initialization(keys, values)
        self._views()

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        """Write the new positions after the filled ones; the filled part, as views."""
        end = self.length + key_states.shape[-2]
        if self.buffers is None:
            shape = (*key_states.shape[:2], end + self.room, key_states.shape[-1])
            keys = key_states.new_zeros(shape, dtype=self.dtype or key_states.dtype)
            self.buffers = (keys, torch.zeros_like(keys))
            self.lazy_initialization(key_states, value_states)
        keys, values = self.buffers
        if end > keys.shape[-2]:
            capacity = max(end, 2 * keys.shape[-2])
            keys, values = self._grown(keys, capacity), self._grown(values, capacity)
            self.buffers = (keys, values)
        keys[:, :, self.length : end] = key_states
        values[:, :, self.length : end] = value_states
        self.length = end
        views = self._views()
        decoding = key_states.shape[-2] == 1
        return (keys, values) if decoding and keys.dtype != key_states.dtype else views

    def _grown(self, buffer: Tensor, capacity: int) -> Tensor:
        shape = (*buffer.shape[:2], capacity, buffer.shape[-1])
        grown = buffer.new_zeros(shape)
        grown[:, :, : self.length] = buffer[:, :, : self.length]
        return grown

    def _views(self) -> tuple[Tensor, Tensor]:
        assert self.buffers is not None
        keys, values = (b[:, :, : self.length] for b in self.buffers)
        self.keys, self.values = keys, values
        return keys, values

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keep only the rows `indices` (ascending), moved up in place: each row that stays copies its
        filled part to the front of the buffers, which keep their memory (no second copy of the cache)."""
        if self.buffers is not None:
            rows = indices.tolist()
            if any(a >= b for a, b in itertools.pairwise(rows)):
                raise ValueError(f"rows to keep must ascend, got {rows}")
            for to, row in enumerate(rows):  # ascending: a row is read before anything overwrites it
                if to != row:
                    for buffer in self.buffers:
                        buffer[to, :, : self.length] = buffer[row, :, : self.length]
            self.buffers = (self.buffers[0][: len(rows)], self.buffers[1][: len(rows)])
            self._views()

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` positions (the sign convention of `DynamicLayer.crop`)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, got {tokens_to_remove}")
        if self.buffers is not None and tokens_to_remove < 0:
            self.length = max(self.length + tokens_to_remove, 0)
            self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every row `repeats` times."""
        if self.buffers is not None:
            keys, values = self.buffers
            self.buffers = (keys.repeat_interleave(repeats, dim=0), values.repeat_interleave(repeats, dim=0))
            self._views()

    def reset(self) -> None:
        """Forget everything."""
        self.buffers, self.length = None, 0
        super().reset()


class RoomyCache(DynamicCache):
    """A `DynamicCache` of `RoomyLayer`s, one per layer of the model (in `dtype`, or the keys' own)."""

    def __init__(self, layers: int, room: int, dtype: torch.dtype | None = None) -> None:
        Cache.__init__(self, layers=[RoomyLayer(room, dtype) for _ in range(layers)])


def batch_cache(
    kvs: Sequence[KV | None],
    reused: Sequence[int],
    layers: int,
    room: int | None,
    dtype: torch.dtype | None = None,
) -> DynamicCache | None:
    """One cache over the batch: row i's first `reused[i]` kept tokens, right-aligned (`extend_batch`) over
    ``max(reused)`` positions, with room for `room` more (`RoomyCache`, in the kept caches' dtype, or in
    `dtype` when nothing is reused). With `room` None: a `DynamicCache`, which appends by concatenation
    (the sampler before the engine boundary), or None when nothing is reused."""
    slots, rows = max(reused), len(kvs)
    if slots == 0:
        return RoomyCache(layers, room, dtype) if room is not None else None
    like = next(kv for kv in kvs if kv is not None)
    k0 = like[0][0]
    # one allocation for every layer (see `packed`), zeros where rows are padded
    block = k0.new_zeros((len(like), 2, rows, k0.shape[0], slots + (room or 0), k0.shape[-1]))
    filled = []
    for layer in range(len(like)):
        keys, values = block[layer, 0], block[layer, 1]
        for i, (kv, n) in enumerate(zip(kvs, reused, strict=True)):
            if kv is not None and n > 0:
                keys[i, :, slots - n : slots] = kv[layer][0][:, :n]
                values[i, :, slots - n : slots] = kv[layer][1][:, :n]
        filled.append((keys, values))
    if room is None:
        return DynamicCache(ddp_cache_data=filled)
    cache = RoomyCache(layers, room, k0.dtype)
    for held, (keys, values) in zip(cache.layers, filled, strict=True):
        assert isinstance(held, RoomyLayer)
        held.hold(keys, values, slots)
    return cache


Keep = Callable[[int, Sequence[int], Any, int, Tensor], None]
"""Called as ``keep(row, drawn, cache, index, mask)`` when a row leaves the batch, with the tokens it drew,
its index in the cache now and its attention mask over the cache (which then holds its prompt and reply
but the last drawn token)."""


@torch.inference_mode()
def sample_batch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    pad_id: int,
    stop_ids: frozenset[int],
    config: SamplingConfig,
    generator: torch.Generator,
    prefix: KVStore | None = None,
    in_place: bool = True,
) -> list[Sample]:
    """Continue every prompt until a stop token or `config.max_new_tokens`, as one cached batch that
    reuses what `prefix` keeps and keeps what it computes (see the module doc). Without `prefix` every
    prompt is prefilled whole; without `in_place` it samples as before the engine: the cache appends by
    concatenation (`batch_cache`) and the prefill computes logits at every prompt position, not the last.

    Rows that finished leave the batch (and the cache), so a long reply does not keep short ones busy.
    The stop token, when reached, is the last id of a sample.
    """
    device = next(model.parameters()).device
    taken = prefix.reuse(model, prompts) if prefix is not None else [Reuse(0, None, None)] * len(prompts)
    reused = [r.tokens for r in taken]
    suffixes = [p[n:] for p, n in zip(prompts, reused, strict=True)]
    ids, mask, positions = (t.to(device) for t in extend_batch(suffixes, reused, pad_id))
    room = ids.shape[1] + config.max_new_tokens if in_place else None
    dtype = prefix.dtype if prefix is not None else None
    cache = batch_cache([r.kv for r in taken], reused, model.config.num_hidden_layers, room, dtype)
    keep = None
    if prefix is not None and prefix.turns:
        prefix.settle(taken)  # the batch's cache holds its own copy of what its rows reused
        keep = functools.partial(_keep_row, prefix, prompts)
    del taken  # nor does the batch hold on to the entries it reused
    last = {"logits_to_keep": 1} if in_place else {}  # before the engine: logits at every position
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, **last
    )
    return decode(
        model, out.cache, out.logits[:, -1], mask, positions[:, -1:], stop_ids, config, generator, keep
    )


def _keep_row(
    store: KVStore,
    prompts: Sequence[Sequence[int]],
    row: int,
    drawn: Sequence[int],
    cache: Any,
    index: int,
    mask: Tensor,
) -> None:
    """A `Keep` putting the leaving row's prompt and reply into `store` as it leaves (its unpadded
    positions, copied), so rows the store cannot hold are never copied nor held to the batch's end."""
    positions = mask.nonzero().squeeze(-1)
    if store.admits(len(positions)):
        kv = packed([(layer.keys[index], layer.values[index]) for layer in cache.layers], positions)
        store.put((*prompts[row], *drawn)[: len(positions)], kv, shared=False)


def packed(layers: Sequence[tuple[Tensor, Tensor]], positions: Tensor | None = None) -> KV:
    """`layers`' keys and values (``[heads, T, head_dim]`` each; only the `positions` of T, when given)
    copied into one allocation, as a view per layer, so that a dropped entry frees one large block (which
    the allocator can hand back to the system whole) rather than sixty small tensors of a 30-layer model
    freed in any order."""
    keys = layers[0][0]
    length = keys.shape[1] if positions is None else len(positions)
    block = keys.new_empty((len(layers), 2, keys.shape[0], length, keys.shape[2]))
    for i, pair in enumerate(layers):
        for j, part in enumerate(pair):
            if positions is None:
                block[i, j].copy_(part)
            else:
                torch.index_select(part, 1, positions, out=block[i, j])
    return tuple((block[i, 0], block[i, 1]) for i in range(len(layers)))


def decode(
    model: Any,
    cache: Any,
    logits: Tensor,
    mask: Tensor,
    last_positions: Tensor,
    stop_ids: frozenset[int],
    config: SamplingConfig,
    generator: torch.Generator,
    keep: Keep | None = None,
) -> list[Sample]:
    """Draw tokens for every row of a prefilled batch (`logits` ``[B, V]`` at each row's last prompt token,
    `mask` ``[B, T]`` over the cache, `last_positions` ``[B, 1]``) until each stops or has drawn
    `config.max_new_tokens`; `keep` sees each row's cache as it leaves."""
    device = logits.device
    rows = logits.shape[0]
    active = list(range(rows))
    tokens: list[list[int]] = [[] for _ in range(rows)]
    logps: list[list[float]] = [[] for _ in range(rows)]
    stop = torch.tensor(sorted(stop_ids), device=device)
    positions = last_positions
    for step in range(config.max_new_tokens):
        chosen, chosen_logp = draw(logits, config, generator)
        for row, (tok, lp) in enumerate(zip(chosen.tolist(), chosen_logp.tolist(), strict=True)):
            tokens[active[row]].append(tok)
            logps[active[row]].append(lp)
        going = ~torch.isin(chosen, stop) & (step + 1 < config.max_new_tokens)
        if not bool(going.all()):
            if keep is not None:
                for index in (~going).nonzero().squeeze(-1).tolist():
                    keep(active[index], tokens[active[index]], cache, index, mask[index])
            if not bool(going.any()):
                break
            kept = going.nonzero().squeeze(-1)
            cache.batch_select_indices(kept)
            chosen, mask, positions = chosen[kept], mask[kept], positions[kept]
            active = [active[i] for i in kept.tolist()]
        mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=-1)
        positions = positions + 1
        out = model(
            input_ids=chosen[:, None],
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
        )
        cache, logits = out.cache, out.logits[:, -1]
    return _samples(tokens, logps)


def _samples(tokens: Sequence[Sequence[int]], logps: Sequence[Sequence[float]]) -> list[Sample]:
    return [Sample(tuple(t), tuple(lp)) for t, lp in zip(tokens, logps, strict=True)]


def draw(logits: Tensor, config: SamplingConfig, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Next token per row of `logits` ``[B, V]`` and its log-probability under the distribution it was
    drawn from (softmax of logits / temperature; plain softmax when greedy), both ``[B]``."""
    logits = logits.float()
    if config.greedy:
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logp.argmax(dim=-1)
    else:
        logp = torch.log_softmax(logits / config.temperature, dim=-1)
        chosen = inverse_cdf(logp.exp().cpu(), generator).to(logits.device)
    return chosen, logp.gather(-1, chosen[:, None]).squeeze(-1)


def inverse_cdf(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One index per row of `probs` ``[B, V]``, drawn with probability proportional to its entry: the
    first whose running sum passes a uniform draw scaled to the row's total. One random number a row,
    where `torch.multinomial` draws one for every entry of the vocabulary (30 ms a step at 31 rows of
    49k entries on 2 cores); an entry of probability 0 is never drawn.

    >>> inverse_cdf(torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]]), torch.Generator().manual_seed(0))[0]
    tensor(1)
    """
    cdf = probs.cumsum(dim=-1)
    point = torch.rand((probs.shape[0], 1), generator=generator, dtype=cdf.dtype) * cdf[:, -1:]
    # the first index whose running sum exceeds the point (searchsorted's right side skips zero entries)
    return torch.searchsorted(cdf, point, right=True).squeeze(-1).clamp_max(probs.shape[1] - 1)


class TorchEngine:
    """The CPU `Engine` (`sessionrl.policy.engine`): `sample_batch` over the trainer's own module, with a
    `KVStore` kept while the policy version stays (in bfloat16 when the store says so), and its linear
    layers multiplied in bfloat16 (`BF16Matmuls`) where the CPU has the units for it. Safe to call from
    several threads (one batch at a time)."""

    def __init__(
        self,
        model: Any,
        *,
        pad_id: int,
        stop_ids: frozenset[int],
        store: KVStore | None = None,
        version: int = 0,
        in_place: bool = True,
        bf16: bool | None = None,
    ) -> None:
        self.model = model
        self.in_place = in_place
        """Decode into a cache with room reserved, logits at the last prompt position only (`sample_batch`);
        off, it measures the sampler before."""
        self.bf16 = bf16_by_default(model) if bf16 is None else bf16
        """Multiply the linear layers in bfloat16 (`BF16Matmuls`); by default where `bf16_by_default`."""
        self._matmuls: BF16Matmuls | None = None
        self.pad_id = pad_id
        self.stop_ids = stop_ids
        self.store = store if store is not None else KVStore()
        """The kept caches, in the store's dtype (`KVStore.dtype`)."""
        self._policy_version = version
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        """The policy version sampled with now."""
        return self._policy_version

    @property
    def narrow(self) -> bool:
        """Whether the caches are kept narrower than the model computes (read by `kept_or_sdpa`)."""
        dtype = self.store.dtype
        return dtype is not None and dtype != next(self.model.parameters()).dtype

    def refresh(self, model: Any, version: int) -> None:
        """Sample with `model` as policy `version` from now on; nothing kept from before is reused."""
        with self._lock:
            self.model = model
            self._policy_version = version
            self.store.clear()
            self._matmuls = None
            give_back_freed()

    def release(self) -> None:
        """Drop the kept key/value caches and the bfloat16 copies (up to `KVStore.max_tokens` tokens of
        cache: 1.5 to 3 GB for SmolLM2-135M) before the weights change, and hand the freed pages back to the
        system (`give_back_freed`)."""
        with self._lock:
            self.store.clear()
            self._matmuls = None
            give_back_freed()

    def sample(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, generator: torch.Generator
    ) -> list[Completion]:
        """Continue `prompts` as one batch (`sample_batch`); the model is left in the mode it was found."""
        with self._lock:
            was_training = self.model.training
            self.model.eval()
            if self.bf16 and self._matmuls is None:
                self._matmuls = BF16Matmuls(self.model)  # the weights of this version, copied once
            if self.narrow:
                use_kept_attention(self.model)  # a packed training pass may have switched it since
            products = self._matmuls if self._matmuls is not None else contextlib.nullcontext()
            try:
                with products:
                    samples = sample_batch(
                        self.model,
                        prompts,
                        pad_id=self.pad_id,
                        stop_ids=self.stop_ids,
                        config=sampling,
                        generator=generator,
                        prefix=self.store,
                        in_place=self.in_place,
                    )
            finally:
                self.model.train(was_training)
            return [
                Completion(tuple(p), s.token_ids, s.logprobs, self._policy_version)
                for p, s in zip(prompts, samples, strict=True)
            ]


__all__ = [
    "KVStore",
    "Reuse",
    "RoomyCache",
    "RoomyLayer",
    "Sample",
    "TorchEngine",
    "batch_cache",
    "common_prefix",
    "decode",
    "draw",
    "extend_batch",
    "inverse_cdf",
    "left_pad",
    "packed",
    "sample_batch",
    "shared_length",
]
