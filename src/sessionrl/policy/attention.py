"""SDPA attention that reads grouped key/value heads as they are, registered with transformers' public
attention interface under `GQA_SDPA`.

SmolLM2 has 9 query heads over 3 key/value heads. Given a padding mask and more than one query position
(a batch's prefill), transformers' own SDPA function copies the keys and values to one per query head
before calling `scaled_dot_product_attention` (a copy per layer of the whole cache: for a 16-row batch
over 600 positions, 22 MB per layer, a third of a turn's time in the engine's profile). `gqa_sdpa` hands
SDPA the grouped heads with ``enable_gqa=True`` instead, which gives the same output. Every other pass
(no mask, one query position, where transformers already avoids the copy, or a model without grouped
heads) goes to transformers' function unchanged.

`load_policy` (`sessionrl.policy.tiny`) loads every model with it, and a model switched to packed
attention (`sessionrl.train.llm.packing`) uses it outside packed passes.
"""

from __future__ import annotations

from typing import Any, Final

from torch import Tensor
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

GQA_SDPA: Final = "sessionrl_gqa_sdpa"
"""The name `gqa_sdpa` is registered under (``attn_implementation=GQA_SDPA``)."""


def gqa_sdpa(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """Attention of `query` ``[B, heads, Q, d]`` over `key` and `value` ``[B, kv_heads, T, d]`` under
    `attention_mask` (SDPA's: boolean or additive, ``[B, 1, Q, T]``); ``([B, Q, heads, d], None)`` as
    transformers' attention functions return it."""
    groups = getattr(module, "num_key_value_groups", 1)
    plain = kwargs.get("softcap") is None and kwargs.get("position_bias") is None
    if attention_mask is None or query.shape[2] == 1 or groups == 1 or not plain:
        out: tuple[Tensor, Tensor | None] = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
        return out
    attended = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return attended.transpose(1, 2).contiguous(), None


AttentionInterface.register(GQA_SDPA, gqa_sdpa)
ALL_MASK_ATTENTION_FUNCTIONS.register(GQA_SDPA, sdpa_mask)


__all__ = ["GQA_SDPA", "gqa_sdpa"]
