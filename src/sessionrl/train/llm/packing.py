"""Attention for packed micro-batches: several sequences end to end in one row, none attending to another.

A packed row holds sequences of lengths ``n_1, n_2, ...`` one after the other, with position ids that
restart at 0 with each, and their boundaries ``segments = [0, n_1, n_1 + n_2, ..., N]``. The row has no
padding, so the linear layers (most of the work) see real tokens only. Attention runs causally inside each
segment and never across one: each segment is its own causal `scaled_dot_product_attention` call, so it
costs what that sequence alone would (``n_i²``, not ``N²``) and no dense ``[N, N]`` mask is built.

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
    ``[1, N, heads, head_dim]`` as transformers' attention functions do.
    """
    if cu_seq_lens_q is None or attention_mask is not None or query.shape[0] != 1:
        raise ValueError("segment attention takes one packed row with its boundaries and no mask")
    if getattr(module, "sliding_window", None) is not None:
        raise NotImplementedError("segment attention does not apply a sliding window")
    groups = int(getattr(module, "num_key_value_groups", 1))
    bounds = cu_seq_lens_q.tolist()
    parts = [
        F.scaled_dot_product_attention(
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            dropout_p=dropout,
            is_causal=True,
            scale=scaling,
            enable_gqa=groups > 1,
        )
        for start, end in itertools.pairwise(bounds)
        if end > start
    ]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


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


__all__ = ["PACKED", "packed_attention", "packed_kwargs", "segment_attention"]
