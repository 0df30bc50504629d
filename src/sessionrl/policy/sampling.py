"""Batched sampling that computes a shared prompt prefix once.

Concurrent episodes of one domain start with the same long system prompt (the domain policy and the tool
schemas), so the prompts of a batch share a prefix that is most of their length. `sample_batch` runs the
prefix through the model once, at batch size 1, keeps its key/value cache in a `PrefixCache`, and for
every batch whose prompts all start with it expands that cache over the batch and runs only the suffixes:

    prompts   [prefix | suffix_0]        cache  [prefix KV] x B   (computed once, expanded)
              [prefix | suffix_1]  ──▶   input  [pad.. suffix_0]  (pads between prefix and suffix,
              [prefix | suffix_2]               [suffix_1     ]   masked out; positions continue
                                                [. suffix_2   ]   from the prefix's end)

then decodes every row with the cache, dropping rows as they reach a stop token. The kept prefix is
reused by later batches (later turns of the same episodes, batches of one) until the weights change:
it is stamped with the parameters' in-place version counters, which every optimiser step and weight
load advances. A batch whose prompts share no prefix of `min_tokens` runs as one left-padded batch.

Everything runs under `torch.inference_mode` with the model's own attention (SDPA by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from transformers import DynamicCache

if TYPE_CHECKING:
    from sessionrl.policy.llm import SamplingConfig

KV = tuple[tuple[Tensor, Tensor], ...]
"""One key and one value tensor ``[1, heads, T, head_dim]`` per layer."""


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


def weights_stamp(model: Any) -> tuple[int, int]:
    """What changes whenever the weights do: the sum of the parameters' in-place version counters and
    where the first parameter's data lives (a reload or a move puts it elsewhere)."""
    params = list(model.parameters())
    return sum(p._version for p in params), params[0].data_ptr()


@dataclass
class PrefixCache:
    """The key/value cache of one prompt prefix, kept across batches while the weights stay the same."""

    min_tokens: int = 64
    """Shortest prefix worth keeping; batches sharing less run without one."""
    ids: tuple[int, ...] = ()
    kv: KV = ()
    stamp: tuple[int, int] = (-1, -1)
    builds: int = 0
    """Prefixes computed so far."""
    hits: int = 0
    """Batches that reused a kept prefix."""

    def covers(self, prompts: Sequence[Sequence[int]], stamp: tuple[int, int]) -> bool:
        """Whether the kept prefix, computed by the current weights, starts every prompt (with at least one
        token after it)."""
        n = len(self.ids)
        return n > 0 and stamp == self.stamp and all(len(p) > n and tuple(p[:n]) == self.ids for p in prompts)

    def prefix_for(self, model: Any, prompts: Sequence[Sequence[int]]) -> int:
        """Length of the kept prefix for this batch after computing a new one if the batch shares a long
        one the cache does not hold; 0 when the batch runs without a prefix."""
        stamp = weights_stamp(model)
        if self.covers(prompts, stamp):
            self.hits += 1
            return len(self.ids)
        n = min(common_prefix(prompts), min(len(p) for p in prompts) - 1)
        if len(prompts) < 2 or n < self.min_tokens:
            return 0
        device = next(model.parameters()).device
        out = model(input_ids=torch.tensor([list(prompts[0][:n])], device=device), use_cache=True)
        self.ids = tuple(prompts[0][:n])
        self.kv = tuple((layer.keys, layer.values) for layer in out.cache.layers)
        self.stamp = stamp
        self.builds += 1
        return n


def suffix_batch(
    suffixes: Sequence[Sequence[int]], prefix_len: int, pad_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Suffixes padded on their left to one width ``W``, after a prefix of `prefix_len` tokens:
    ``(ids [B, W], attention_mask [B, prefix_len + W], positions [B, W])``.

    >>> ids, mask, pos = suffix_batch([[7, 8], [9]], prefix_len=2, pad_id=0)
    >>> ids.tolist(), mask.tolist(), pos.tolist()
    ([[7, 8], [0, 9]], [[1, 1, 1, 1], [1, 1, 0, 1]], [[2, 3], [2, 2]])
    """
    width = max(len(s) for s in suffixes)
    ids = torch.full((len(suffixes), width), pad_id, dtype=torch.long)
    own = torch.zeros((len(suffixes), width), dtype=torch.long)
    for i, row in enumerate(suffixes):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        own[i, width - len(row) :] = 1
    mask = torch.cat([torch.ones((len(suffixes), prefix_len), dtype=torch.long), own], dim=-1)
    positions = prefix_len + (own.cumsum(-1) - 1).clamp_min(0)
    return ids, mask, positions


@torch.inference_mode()
def sample_batch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    pad_id: int,
    stop_ids: frozenset[int],
    config: SamplingConfig,
    generator: torch.Generator,
    prefix: PrefixCache | None = None,
) -> list[Sample]:
    """Continue every prompt until a stop token or `config.max_new_tokens`, as one cached batch whose shared
    prefix comes from `prefix` (computed there once; see the module doc). Without `prefix`, or when the
    prompts share too little, the batch is left-padded and computed whole.

    Rows that finished leave the batch (and the cache), so a long reply does not keep short ones busy.
    The stop token, when reached, is the last id of a sample.
    """
    device = next(model.parameters()).device
    n = prefix.prefix_for(model, prompts) if prefix is not None else 0
    if prefix is not None and n > 0:
        ids, mask, positions = (t.to(device) for t in suffix_batch([p[n:] for p in prompts], n, pad_id))
        rows = len(prompts)
        cache = DynamicCache(
            ddp_cache_data=[(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in prefix.kv]
        )
    else:
        ids, mask = (t.to(device) for t in left_pad(prompts, pad_id))
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        cache = None
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
    return decode(model, out.cache, out.logits[:, -1], mask, positions[:, -1:], stop_ids, config, generator)


def decode(
    model: Any,
    cache: Any,
    logits: Tensor,
    mask: Tensor,
    last_positions: Tensor,
    stop_ids: frozenset[int],
    config: SamplingConfig,
    generator: torch.Generator,
) -> list[Sample]:
    """Draw tokens for every row of a prefilled batch (`logits` ``[B, V]`` at each row's last prompt token,
    `mask` ``[B, T]`` over the cache, `last_positions` ``[B, 1]``) until each stops."""
    device = logits.device
    rows = logits.shape[0]
    active = list(range(rows))
    tokens: list[list[int]] = [[] for _ in range(rows)]
    logps: list[list[float]] = [[] for _ in range(rows)]
    stop = torch.tensor(sorted(stop_ids), device=device)
    positions = last_positions
    for _ in range(config.max_new_tokens):
        chosen, chosen_logp = draw(logits, config, generator)
        for row, (tok, lp) in enumerate(zip(chosen.tolist(), chosen_logp.tolist(), strict=True)):
            tokens[active[row]].append(tok)
            logps[active[row]].append(lp)
        going = ~torch.isin(chosen, stop)
        if not bool(going.any()):
            break
        if not bool(going.all()):
            keep = going.nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            chosen, mask, positions = chosen[keep], mask[keep], positions[keep]
            active = [active[i] for i in keep.tolist()]
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
        draws = torch.multinomial(logp.exp().cpu(), 1, generator=generator).squeeze(-1)
        chosen = draws.to(logits.device)
    return chosen, logp.gather(-1, chosen[:, None]).squeeze(-1)


__all__ = [
    "PrefixCache",
    "Sample",
    "common_prefix",
    "decode",
    "draw",
    "left_pad",
    "sample_batch",
    "suffix_batch",
    "weights_stamp",
]
