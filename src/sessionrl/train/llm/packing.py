"""Attention for packed micro-batches: several sequences end to end in one row, none attending to another.

A packed row holds segments of lengths ``n_1, n_2, ...`` one after the other, their boundaries
``segments = [0, n_1, n_1 + n_2, ..., N]``. A segment is a whole sequence or, where sequences share a
prefix (`sessionrl.train.llm.prefixes`), a piece of one: it sees its *context* (the segments it
continues) and then itself, causally, and nothing else; its position ids continue its context's. The row
has no padding, so the linear layers (most of the work) see real tokens only. Segments of similar length
and context are gathered into a batch of their own for one `scaled_dot_product_attention` call (causal,
or with a small ``[segments, width, context + width]`` mask when they have a context), so the cost is
about ``Σ n_i (c_i + n_i)``, never ``N²``, and no ``[N, N]`` mask is built. `plan_segments` works the
gathering out once per forward pass; every layer follows it.

The segment attention is registered with transformers' public attention interface under `PACKED`, and
`use_packed_attention` selects it with the model's public `set_attn_implementation`. A forward pass handed a
segment plan (`packed_kwargs`) attends by segments; any other pass (sampling, a padded batch) goes to
transformers' own SDPA function with SDPA's mask, so a model switched to `PACKED` samples exactly as
before. A packed pass hands the model an all-ones padding mask: SDPA's mask function then builds no mask
(a row without padding is plainly causal), and transformers does not read the restarting positions as
its own packing format.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Final

import torch
from torch import Tensor
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

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
    segment_plan: SegmentPlan | None = None,
    **_: Any,
) -> tuple[Tensor, None]:
    """Attention of each segment of a packed row to its context and, causally, to itself.

    `query` is ``[1, heads, N, head_dim]`` and `key`, `value` ``[1, kv_heads, N, head_dim]``; returns
    ``[1, N, heads, head_dim]`` as transformers' attention functions do. `segment_plan` says which keys
    each query sees (`plan_segments`); without one, `cu_seq_lens_q` holds the boundaries of segments that
    see nothing before themselves. Each group of the plan is one SDPA call over its gathered queries and
    keys; padded queries are dropped when the rows are put back in place.
    """
    if attention_mask is not None or query.shape[0] != 1:
        raise ValueError("segment attention takes one packed row with its boundaries and no mask")
    if getattr(module, "sliding_window", None) is not None:
        raise NotImplementedError("segment attention does not apply a sliding window")
    if segment_plan is None:
        if cu_seq_lens_q is None:
            raise ValueError("segment attention takes one packed row with its boundaries and no mask")
        segment_plan = plan_segments(cu_seq_lens_q.tolist(), None, query.device)
    segment_plan.calls.append(query.shape[2])
    gqa = int(getattr(module, "num_key_value_groups", 1)) > 1
    parts = []
    for group in segment_plan.groups:
        q = _rows(query, group.query)  # [segments, heads, width, head_dim]
        k, v = _rows(key, group.key), _rows(value, group.key)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=group.mask,
            dropout_p=dropout,
            is_causal=group.mask is None,
            scale=scaling,
            enable_gqa=gqa,
        )
        parts.append(out.transpose(0, 1)[:, group.real])  # [heads, real tokens, head_dim]
    heads, n, dim = query.shape[1], query.shape[2], query.shape[3]
    placed = query.new_zeros(heads, n, dim).index_copy(1, segment_plan.positions, torch.cat(parts, dim=1))
    return placed.transpose(0, 1).unsqueeze(0).contiguous(), None


def _rows(x: Tensor, index: Tensor) -> Tensor:
    """Tokens `index` (``[S, L]`` row indices) of ``x [1, heads, N, dim]`` as ``[S, heads, L, dim]``.

    Gathered with `index_select`, whose backward adds the gradients of a token taken several times (a
    shared prefix's keys) in a fixed order, so a step gives the same weights every time on several threads
    (indexing with the index tensor may sum them in a different order from one run to the next).
    """
    tokens = x[0].transpose(0, 1).index_select(0, index.reshape(-1))  # [S * L, heads, dim]
    return tokens.view(*index.shape, x.shape[1], x.shape[3]).transpose(1, 2)


@dataclass(frozen=True)
class SegmentGroup:
    """Segments attended in one SDPA call: row indices of their query slots ``[S, W]`` (each padded with
    its last token) and key slots ``[S, C + W]`` (their context, padded, then their own query slots);
    `mask` ``[S, 1, W, C + W]`` is which keys each query sees (None when no segment has a context: plain
    causal); `real` ``[S, W]`` marks the query slots that are not padding."""

    query: Tensor
    key: Tensor
    mask: Tensor | None
    real: Tensor


@dataclass(frozen=True)
class SegmentPlan:
    """How one packed row's tokens attend: its groups, and the row index of each real query slot in the
    order the groups list them (where their outputs go back)."""

    groups: tuple[SegmentGroup, ...]
    positions: Tensor
    calls: list[int] = field(default_factory=list)
    """The row length of every attention call that followed the plan (one per layer): a packed pass whose
    list stays empty never reached the segment attention."""


def plan_segments(bounds: list[int], parents: list[int] | None, device: torch.device) -> SegmentPlan:
    """The plan of a row whose segments lie at ``bounds[i] .. bounds[i + 1]``, each seeing, before itself,
    segment ``parents[i]`` and what that one sees (``-1`` or no `parents`: nothing).

    Segments are grouped by their own length (`length_buckets`), then by their context's.
    """
    starts, lengths = bounds[:-1], [b - a for a, b in itertools.pairwise(bounds)]
    contexts: list[list[int]] = []
    for i, parent in enumerate(parents or [-1] * len(lengths)):
        if parent >= i:
            raise ValueError(f"segment {i} continues segment {parent}, which does not come before it")
        above = [] if parent < 0 else contexts[parent] + list(range(bounds[parent], bounds[parent + 1]))
        contexts.append(above)
    groups = []
    for bucket in length_buckets(lengths):
        alone = [i for i in bucket if not contexts[i]]
        after = [i for i in bucket if contexts[i]]
        if alone:
            groups.append(_group(alone, starts, lengths, contexts, device))
        for sub in length_buckets([len(contexts[i]) for i in after]):
            groups.append(_group([after[j] for j in sub], starts, lengths, contexts, device))
    positions = torch.cat([g.query[g.real] for g in groups]) if groups else torch.zeros(0, dtype=torch.long)
    return SegmentPlan(tuple(groups), positions.to(device))


def _group(
    members: list[int], starts: list[int], lengths: list[int], contexts: list[list[int]], device: torch.device
) -> SegmentGroup:
    """One SDPA call's gathering for segments `members` (see `SegmentGroup`)."""
    width = max(lengths[i] for i in members)
    offsets = torch.arange(width, device=device)
    size = torch.tensor([lengths[i] for i in members], device=device)[:, None]
    start = torch.tensor([starts[i] for i in members], device=device)[:, None]
    query = start + torch.minimum(offsets[None], size - 1)  # [segments, width], padded by the last
    real = offsets[None] < size
    seen = max(len(contexts[i]) for i in members)
    if seen == 0:
        return SegmentGroup(query, query, None, real)
    context = torch.tensor(
        [contexts[i] + [starts[i]] * (seen - len(contexts[i])) for i in members], device=device
    )
    held = torch.tensor([len(contexts[i]) for i in members], device=device)[:, None]
    known = torch.arange(seen, device=device)[None] < held  # [segments, seen]: real context slots
    causal = offsets[None, :] <= offsets[:, None]  # [width, width]: key slot j seen from query slot i
    mask = torch.cat(
        [known[:, None, :].expand(-1, width, -1), causal[None].expand(len(members), -1, -1)], dim=-1
    )
    return SegmentGroup(query, torch.cat([context, query], dim=1), mask[:, None], real)


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


def packed_or_sdpa(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    segment_plan: SegmentPlan | None = None,
    cu_seq_lens_q: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """The attention `PACKED` names: `segment_attention` for a pass handed a segment plan or segment
    boundaries, transformers' SDPA function (the attention of a model loaded with ``"sdpa"``) otherwise."""
    if segment_plan is None and cu_seq_lens_q is None:
        out: tuple[Tensor, Tensor | None] = sdpa_attention_forward(
            module, query, key, value, attention_mask, **kwargs
        )
        return out
    return segment_attention(
        module,
        query,
        key,
        value,
        attention_mask,
        segment_plan=segment_plan,
        cu_seq_lens_q=cu_seq_lens_q,
        **kwargs,
    )


AttentionInterface.register(PACKED, packed_or_sdpa)
ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED, sdpa_mask)


def use_packed_attention(model: Any) -> None:
    """Run `model`'s attention as `packed_or_sdpa`, through transformers' public `set_attn_implementation`
    (a no-op once switched). The switch stays: outside a packed pass the attention is SDPA."""
    model.set_attn_implementation(PACKED)


def packed_kwargs(position_ids: Tensor, segments: Tensor, parents: Tensor | None = None) -> dict[str, Any]:
    """What a packed forward pass hands the model: an all-ones padding mask (see the module doc), the
    tokens' positions, the segment boundaries (under the names transformers gives variable-length
    attention), the attention plan every layer follows (`plan_segments`, made once per pass; its `calls`
    tell whether the model followed it) and no cache."""
    longest = int((segments[1:] - segments[:-1]).max()) if segments.numel() > 1 else 0
    plan = plan_segments(segments.tolist(), None if parents is None else parents.tolist(), segments.device)
    return {
        "attention_mask": torch.ones_like(position_ids, dtype=torch.bool),
        "position_ids": position_ids,
        "segment_plan": plan,
        "cu_seq_lens_q": segments,
        "cu_seq_lens_k": segments,
        "max_length_q": longest,
        "max_length_k": longest,
        "use_cache": False,
    }


__all__ = [
    "PACKED",
    "SegmentGroup",
    "SegmentPlan",
    "length_buckets",
    "packed_kwargs",
    "packed_or_sdpa",
    "plan_segments",
    "segment_attention",
    "use_packed_attention",
]
