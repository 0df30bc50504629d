"""Attention over a key/value cache kept narrower than the model computes: bfloat16 under float32.

At the few thousand positions a τ-bench episode reaches, reading the key/value cache is most of a decode
step, and the read is bound by memory (docs/engines.md). The torch engine can therefore keep its caches
in bfloat16 (`sessionrl.policy.kvstore.KVStore.dtype`; `batching.kv_cache: bfloat16` in a run's config):
half the bytes to read, and half the memory to keep. In a decode step a narrow cache hands the attention its
whole buffer, room for the tokens still to come included (`sessionrl.policy.kvcache.RoomyLayer`), because
torch's bfloat16 batched products are fast on contiguous memory only; the attention reads the positions the
mask covers.

`kept_or_sdpa`, registered with transformers' public attention interface under `KEPT`, attends so:

- keys in the query's dtype (training, a float32 cache): transformers' SDPA function, unchanged;
- a decode step against a narrow cache (a query per row, or up to `FEW_QUERIES` when draft tokens are
  checked with it): `decode_attention`, two products in the cache's dtype with a float32 softmax
  between them, over the key/value heads without repeating them;
- a prefill against a narrow cache: `widened_attention`, torch's SDPA on the cache widened to the query's
  dtype (one copy per layer, small beside the prefill's own work), its key/value heads not repeated.

Its mask function (`kept_mask`) always builds the mask of a decode step, whose width is how much of the
buffer is filled. `use_kept_attention` selects both with the model's public `set_attn_implementation`;
the engine does so before each batch it samples from a narrow cache (0.3 ms), since the trainer's packed
passes switch the same model to the packed attention.
"""

from __future__ import annotations

from typing import Any, Final

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

KEPT: Final = "sessionrl_kept"
"""Name of `kept_or_sdpa` in transformers' attention and mask interfaces."""

FEW_QUERIES: Final = 16
"""Most queries a row may bring to be attended as a decode step is (`decode_attention`): the drawn token
and the draft tokens checked with it (`sessionrl.policy.lookup`)."""


def kept_or_sdpa(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """The attention `KEPT` names (see the module doc): `query` ``[B, H, T, D]``; `key` and `value`
    ``[B, H_kv, S, D]`` (a narrow cache's decode step: ``[B, H_kv, C, D]``, its whole buffer, of which
    the mask's width ``S`` is filled); `attention_mask` SDPA's (boolean, True where a query may attend;
    None when every query sees every position up to its own); the output ``[B, T, H, D]``."""
    if key.dtype == query.dtype:
        out: tuple[Tensor, Tensor | None] = sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
        return out
    if dropout:
        raise ValueError("dropout against a narrow cache: narrow caches serve sampling, in eval mode")
    if query.shape[2] > FEW_QUERIES or (query.shape[2] > 1 and attention_mask is None):
        causal = getattr(module, "is_causal", True)
        return widened_attention(query, key, value, attention_mask, scaling=scaling, causal=causal), None
    if attention_mask is None:
        raise ValueError(
            "a decode step against a narrow cache needs a mask to tell its filled positions: run the model "
            f"with the {KEPT!r} attention (use_kept_attention), whose mask function always builds one"
        )
    return decode_attention(query, key, value, attention_mask, scaling), None


def widened_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    *,
    scaling: float | None = None,
    causal: bool = True,
) -> Tensor:
    """A prefill against a narrow cache: torch's SDPA on `key` and `value` widened to `query`'s dtype, where
    each key/value head serves its group of query heads (`enable_gqa`). Transformers' SDPA function copies
    the key/value heads for each query head first whenever a mask is given, on CPU: the same result, and a
    wide prefill over long caches took 1.4 to 1.9x as long (docs/engines.md). Without a mask every query
    sees the positions up to its own (`causal`), which needs as many keys as queries. Shapes as
    `kept_or_sdpa`'s, the output ``[B, T, H, D]``."""
    wide = query.dtype
    causal = causal and attention_mask is None and query.shape[2] > 1
    if causal and key.shape[2] != query.shape[2]:
        raise ValueError(
            f"{query.shape[2]} queries over {key.shape[2]} cached positions without a mask: where each query "
            "sits among the positions is unknown"
        )
    out = F.scaled_dot_product_attention(
        query,
        key.to(wide),
        value.to(wide),
        attn_mask=attention_mask,
        scale=scaling,
        is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous()


def decode_attention(
    query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor, scaling: float | None = None
) -> Tensor:
    """A few queries per row (`query` ``[B, H, T, D]``: the decoded token, and any draft tokens checked
    with it) against `key` and `value` (``[B, H_kv, C, D]``, in a dtype of their own) where
    `attention_mask` (``[B, 1, T or 1, S]``, ``S <= C``; boolean, or additive with 0 where allowed)
    allows; positions from ``S`` on are left out, and must hold finite numbers. The products in the
    cache's dtype, the softmax in float32, the output ``[B, T, H, D]`` in `query`'s dtype.

    Query head h reads key/value head ``h // (H / H_kv)``, so the query is regrouped to
    ``[B, H_kv, H / H_kv * T, D]`` and no key is repeated."""
    rows, heads, queries, dim = query.shape
    kv_heads, capacity = key.shape[1], key.shape[2]
    group = heads // kv_heads
    grouped = query.reshape(rows, kv_heads, group * queries, dim).to(key.dtype)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float()
    scores *= dim**-0.5 if scaling is None else scaling
    allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    if capacity > allowed.shape[-1]:
        allowed = F.pad(allowed, (0, capacity - allowed.shape[-1]), value=False)
    per_query = scores.view(rows, kv_heads, group, queries, capacity)
    per_query.masked_fill_(~allowed[:, :, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(weights, value).view(rows, heads, queries, dim)
    return out.transpose(1, 2).to(query.dtype)


def kept_mask(**kwargs: Any) -> Tensor | None:
    """SDPA's mask function (`sdpa_mask`, called with its keywords, as transformers calls it), which
    leaves the mask out where every query sees every position before it (no padding), but for a decode
    step (up to `FEW_QUERIES` queries a row): there the mask's width tells `decode_attention` how much of
    a narrow cache's buffer is filled."""
    if kwargs.get("q_length", FEW_QUERIES + 1) <= FEW_QUERIES:
        kwargs["allow_is_causal_skip"] = False
    mask: Tensor | None = sdpa_mask(**kwargs)
    return mask


AttentionInterface.register(KEPT, kept_or_sdpa)
ALL_MASK_ATTENTION_FUNCTIONS.register(KEPT, kept_mask)


def use_kept_attention(model: Any) -> None:
    """Run `model`'s attention as `kept_or_sdpa`, through transformers' public `set_attn_implementation`."""
    model.set_attn_implementation(KEPT)


__all__ = [
    "FEW_QUERIES",
    "KEPT",
    "decode_attention",
    "kept_mask",
    "kept_or_sdpa",
    "use_kept_attention",
    "widened_attention",
]
