"""Attention for packed micro-batches: several sequences end to end in one row, none attending to another.

A packed row holds sequences of lengths ``n_1, n_2, ...`` one after the other, with position ids that
restart at 0 with each, and their boundaries ``segments = [0, n_1, n_1 + n_2, ..., N]``. The row has no
padding, so the linear layers (most of the work) see real tokens only. Attention runs causally inside each
segment and never across one: the segments are gathered into a batch of their own for one causal
`scaled_dot_product_attention` call (``Σ n_i²`` or a little more, not ``N²``), and no ``[N, N]`` mask is
built.

The model's own attention (SDPA) stays in place for sampling; `packed_attention` selects the segment
attention for the duration of one packed forward pass. It is registered with transformers' attention
interface under `PACKED`, with the mask function of the unpadded (flash) kernels, which builds no mask
for a row without padding.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import torch
from torch import Tensor
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

PACKED: Final = "sessionrl_packed"
"""Name of the segment attention in transformers' attention and mask interfaces."""


def segment_attention(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: Tensor | None = None,
    **_: Any,
) -> tuple[Tensor, None]:
    """Causal attention inside each segment of a packed row (`cu_seq_lens_q` holds the boundaries).

    `query` is ``[1, heads, N, head_dim]`` and `key`, `value` ``[1, kv_heads, N, head_dim]``; returns
    ``[1, N, heads, head_dim]`` as transformers' attention functions do. Segments of similar length
    (`length_buckets`) are gathered into one ``[segments, heads, longest, head_dim]`` batch, right-padded
    with their own last token, and attend in one causal SDPA call: a real query never reaches a padded
    key, which comes after it, and padded queries are dropped when the rows are put back in place.
    """
    if cu_seq_lens_q is None or attention_mask is not None or query.shape[0] != 1:
        raise ValueError("segment attention takes one packed row with its boundaries and no mask")
    if getattr(module, "sliding_window", None) is not None:
        raise NotImplementedError("segment attention does not apply a sliding window")
    bounds = cu_seq_lens_q.tolist()
    starts, lengths = bounds[:-1], [b - a for a, b in itertools.pairwise(bounds)]
    gqa = int(getattr(module, "num_key_value_groups", 1)) > 1
    positions, parts = [], []
    for bucket in length_buckets(lengths):
        width = max(lengths[i] for i in bucket)
        offsets = torch.arange(width, device=query.device)
        size = torch.tensor([lengths[i] for i in bucket], device=query.device)[:, None]
        start = torch.tensor([starts[i] for i in bucket], device=query.device)[:, None]
        index = start + torch.minimum(offsets[None], size - 1)  # [segments, width], padded by the last
        q, k, v = (x[0][:, index].transpose(0, 1) for x in (query, key, value))
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=gqa
        )
        real = offsets[None] < size
        positions.append(index[real])
        parts.append(out.transpose(0, 1)[:, real])  # [heads, real tokens, head_dim]
    heads, n, dim = query.shape[1], query.shape[2], query.shape[3]
    placed = query.new_zeros(heads, n, dim).index_copy(1, torch.cat(positions), torch.cat(parts, dim=1))
    return placed.transpose(0, 1).unsqueeze(0).contiguous(), None


def length_buckets(lengths: list[int]) -> list[list[int]]:
    """Segment indices grouped so each group pads little: longest first, a new group whenever a length
    falls below half its group's longest.

    >>> length_buckets([100, 900, 800, 300, 500])
    [[1, 2, 4], [3], [0]]
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    buckets: list[list[int]] = []
    for i in order:
        if lengths[i] == 0:
            continue
        if buckets and 2 * lengths[i] >= lengths[buckets[-1][0]]:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets


AttentionInterface.register(PACKED, segment_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED, flash_attention_mask)


@contextmanager
def packed_attention(model: Any) -> Iterator[None]:
    """Run `model`'s attention layers as `segment_attention` inside the block (its own attention after)."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = PACKED
    try:
        yield
    finally:
        config._attn_implementation = before


def packed_kwargs(position_ids: Tensor, segments: Tensor) -> dict[str, Any]:
    """What a packed forward pass hands the model: the restarting positions and the segment boundaries
    (under the names transformers gives variable-length attention), no mask and no cache."""
    longest = int((segments[1:] - segments[:-1]).max()) if segments.numel() > 1 else 0
    return {
        "position_ids": position_ids,
        "cu_seq_lens_q": segments,
        "cu_seq_lens_k": segments,
        "max_length_q": longest,
        "max_length_k": longest,
        "use_cache": False,
    }


__all__ = ["PACKED", "length_buckets", "packed_attention", "packed_kwargs", "segment_attention"]
