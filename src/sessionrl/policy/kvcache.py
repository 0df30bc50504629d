"""A batch's key/value cache: the caches its rows reuse, laid out right-aligned, each row's new tokens after
them, with room reserved to decode in place.

    kept     [pad.. kv_0       ][pad suffix_0]    attention mask: 0 on pads
             [kv_1             ][  suffix_1  ]    positions: each row's suffix continues from its own
             [pad...... kv_2   ][.  suffix_2 ]    reused length (pads between are skipped)

`extend_batch` lays out the new tokens, `batch_cache` the reused caches. The cache keeps room for the new
tokens (`RoomyLayer`), so a decode step writes one position per layer in place rather than copying the whole
cache to append it (`DynamicLayer` concatenates), and rows that leave are closed up in place, so the cache
never exists twice. `packed` copies a row's cache out as one allocation, for `sessionrl.policy.kvstore` to
keep.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from sessionrl.policy.attention import FEW_QUERIES

KV = tuple[tuple[Tensor, Tensor], ...]
"""One key and one value tensor ``[heads, T, head_dim]`` per layer."""


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
    full buffer grows by `room` again (draft tokens refused leave holes that take room too), not more: a
    narrow cache's attention reads the whole buffer. `keys` and `values` are views of the filled part.

    With `dtype` narrower than the model computes in (bfloat16 under float32), the buffers hold that
    dtype, and a decode step's `update` (up to `FEW_QUERIES` new positions) hands the attention the whole
    buffers, room included and zeroed, for `sessionrl.policy.attention.kept_or_sdpa` to read as far as
    the mask goes: bfloat16 products are fast on contiguous memory only. Otherwise it hands over the
    filled part."""

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
            capacity = end + self.room
            keys, values = self._grown(keys, capacity), self._grown(values, capacity)
            self.buffers = (keys, values)
        keys[:, :, self.length : end] = key_states
        values[:, :, self.length : end] = value_states
        self.length = end
        views = self._views()
        decoding = key_states.shape[-2] <= FEW_QUERIES
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


__all__ = ["KV", "RoomyCache", "RoomyLayer", "batch_cache", "extend_batch", "packed"]
