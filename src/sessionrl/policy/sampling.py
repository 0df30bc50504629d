"""The CPU engine: batched torch sampling that computes no prompt token twice while the weights stay.

`sample_batch` continues a batch of prompts as one cached batch: what each prompt shares with the
key/value caches a `sessionrl.policy.kvstore.KVStore` keeps (a batch's shared prefix, an episode's earlier
turns) is taken from them, the rest prefilled in one pass over the batch's cache
(`sessionrl.policy.kvcache`), and the batch decoded, rows leaving the batch (and the cache) as they reach a
stop token, each kept in the store for the episode's next turn as it leaves. Asked to (`draft`), a decode
pass also checks tokens looked up in each row's own context, and keeps those the model would have drawn
(`sessionrl.policy.lookup`). `TorchEngine.refresh` (a new
policy version) clears the store: nothing computed by older weights is reused.

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
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from sessionrl.policy.attention import use_kept_attention
from sessionrl.policy.engine import Completion
from sessionrl.policy.kvcache import batch_cache, extend_batch, packed
from sessionrl.policy.kvstore import KVStore, Reuse
from sessionrl.policy.lookup import Lookup, accepted, residual
from sessionrl.policy.memory import give_back_freed
from sessionrl.policy.products import BF16Matmuls, bf16_by_default

if TYPE_CHECKING:
    from sessionrl.policy.llm import SamplingConfig


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
    draft: int = 0,
) -> list[Sample]:
    """Continue every prompt until a stop token or `config.max_new_tokens`, as one cached batch that
    reuses what `prefix` keeps and keeps what it computes (see the module doc). Without `prefix` every
    prompt is prefilled whole; without `in_place` it samples as before the engine: the cache appends by
    concatenation (`batch_cache`) and the prefill computes logits at every prompt position, not the last.

    Rows that finished leave the batch (and the cache), so a long reply does not keep short ones busy.
    The stop token, when reached, is the last id of a sample. With `draft` (and `in_place`), each decode
    pass checks up to `draft` tokens looked up in the row's own context as well (`decode`).
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
    lookups = [Lookup(p) for p in prompts] if draft > 0 and in_place else []
    return decode(
        model,
        out.cache,
        out.logits[:, -1],
        mask,
        positions[:, -1:],
        stop_ids,
        config,
        generator,
        keep,
        lookups,
        draft,
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


DRAFTED_PASS = 48
"""Most tokens a pass computes to check drafts: each of the batch's rows drafts at most
``DRAFTED_PASS // rows - 1`` tokens, none from 24 rows on. A pass of a few tokens costs what a pass of one
does (it reads every weight once), a wide one does not: on 2 CPU cores, SmolLM2-135M's greedy retail
replies ran 1.36x faster at 16 rows drafting 2 tokens and 1.25x drafting 4 (docs/engines.md)."""


@dataclass(slots=True)
class _Rows:
    """The rows of a batch still decoding: their indices in the batch, their cache, its mask and each row's
    last position in it."""

    active: list[int]
    cache: Any
    mask: Tensor
    positions: Tensor

    def going(self, tokens: Sequence[Sequence[int]], stop: Tensor, max_new: int) -> tuple[Tensor, Tensor]:
        """Whether each row goes on (its last token is no stop token and it may draw more), and how many
        more tokens it may draw."""
        device = self.mask.device
        last = torch.tensor([tokens[r][-1] for r in self.active], device=device)
        budget = torch.tensor([max_new - len(tokens[r]) for r in self.active], device=device)
        return ~torch.isin(last, stop) & (budget > 0), budget

    def leave(self, going: Tensor, tokens: Sequence[Sequence[int]], keep: Keep | None) -> Tensor:
        """The rows not `going` leave the batch (and the cache), each seen by `keep` first; the indices of
        those that stay."""
        if keep is not None:
            for index in (~going).nonzero().squeeze(-1).tolist():
                keep(self.active[index], tokens[self.active[index]], self.cache, index, self.mask[index])
        kept = going.nonzero().squeeze(-1)
        if len(kept):
            self.cache.batch_select_indices(kept)
        self.mask, self.positions = self.mask[kept], self.positions[kept]
        self.active = [self.active[i] for i in kept.tolist()]
        return kept


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
    lookups: Sequence[Lookup] = (),
    draft: int = 0,
) -> list[Sample]:
    """Draw tokens for every row of a prefilled batch (`logits` ``[B, V]`` at each row's last prompt token,
    `mask` ``[B, T]`` over the cache, `last_positions` ``[B, 1]``) until each stops or has drawn
    `config.max_new_tokens`; `keep` sees each row's cache as it leaves.

    With `draft` > 0 and a `Lookup` per row (its context so far), each pass also runs up to `draft` tokens
    the row's context proposes after the one drawn (fewer while many rows decode: `DRAFTED_PASS`), and
    keeps those the model would have drawn itself (`sessionrl.policy.lookup`); refused ones stay in the
    cache as masked holes."""
    device = logits.device
    rows = _Rows(list(range(logits.shape[0])), cache, mask, last_positions)
    tokens: list[list[int]] = [[] for _ in rows.active]
    logps: list[list[float]] = [[] for _ in rows.active]
    stop = torch.tensor(sorted(stop_ids), device=device)
    refused: Tensor | None = None
    while rows.active:
        chosen, chosen_logp = draw(logits, config, generator, refused)
        for row, tok, lp in zip(rows.active, chosen.tolist(), chosen_logp.tolist(), strict=True):
            _add(row, tok, lp, tokens, logps, lookups)
        going, budget = rows.going(tokens, stop, config.max_new_tokens)
        if not bool(going.all()):
            kept = rows.leave(going, tokens, keep)
            chosen, budget = chosen[kept], budget[kept]
            if not rows.active:
                break
        k = min(draft, DRAFTED_PASS // len(rows.active) - 1)
        room = zip(rows.active, budget.tolist(), strict=True)
        proposed = [_proposal(lookups, r, min(k, b), stop_ids) for r, b in room]
        width = 1 + max(len(p) for p in proposed)
        ids = torch.zeros((len(rows.active), width), dtype=torch.long, device=device)
        ids[:, 0] = chosen
        for i, p in enumerate(proposed):
            ids[i, 1 : 1 + len(p)] = torch.tensor(p, dtype=torch.long)
        lengths = torch.tensor([len(p) for p in proposed], device=device)
        columns = torch.arange(width, device=device)[None, :]
        rows.mask = torch.cat([rows.mask, (columns <= lengths[:, None]).to(rows.mask.dtype)], dim=-1)
        out = model(
            input_ids=ids,
            attention_mask=rows.mask,
            position_ids=rows.positions + 1 + columns,
            cache=rows.cache,
            use_cache=True,
            **({"logits_to_keep": width} if width > 1 else {}),
        )
        rows.cache = out.cache
        if width == 1:
            logits, refused = out.logits[:, -1], None
            rows.positions = rows.positions + 1
            continue
        n_kept, draft_logp = accepted(out.logits[:, :-1], ids[:, 1:], lengths, config.temperature, generator)
        for i, (row, n) in enumerate(zip(rows.active, n_kept.tolist(), strict=True)):
            for j in range(n):
                _add(row, int(ids[i, 1 + j]), float(draft_logp[i, j]), tokens, logps, lookups)
        rows.mask[:, -width:] *= (columns <= n_kept[:, None]).to(rows.mask.dtype)
        rows.positions = rows.positions + 1 + n_kept[:, None]
        index = torch.arange(len(rows.active), device=device)
        logits = out.logits[index, n_kept]
        refused = torch.where(n_kept < lengths, ids[index, (1 + n_kept).clamp_max(width - 1)], -1)
        going, _ = rows.going(tokens, stop, config.max_new_tokens)
        if not bool(going.all()):
            kept = rows.leave(going, tokens, keep)
            logits, refused = logits[kept], refused[kept]
    return _samples(tokens, logps)


def _add(
    row: int,
    token: int,
    logp: float,
    tokens: list[list[int]],
    logps: list[list[float]],
    lookups: Sequence[Lookup],
) -> None:
    tokens[row].append(token)
    logps[row].append(logp)
    if lookups:
        lookups[row].append(token)


def _proposal(lookups: Sequence[Lookup], row: int, k: int, stop_ids: frozenset[int]) -> list[int]:
    """Up to `k` draft tokens for `row` (none without lookups), cut after the first stop token: a reply
    ends there."""
    if not lookups or k <= 0:
        return []
    proposed = lookups[row].draft(k)
    for i, token in enumerate(proposed):
        if token in stop_ids:
            return proposed[: i + 1]
    return proposed


def _samples(tokens: Sequence[Sequence[int]], logps: Sequence[Sequence[float]]) -> list[Sample]:
    return [Sample(tuple(t), tuple(lp)) for t, lp in zip(tokens, logps, strict=True)]


def draw(
    logits: Tensor, config: SamplingConfig, generator: torch.Generator, refused: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Next token per row of `logits` ``[B, V]`` and its log-probability under the distribution it was
    drawn from (softmax of logits / temperature; plain softmax when greedy), both ``[B]``. A row's
    `refused` token (``[B]``, -1 for none: a draft token just refused, `sessionrl.policy.lookup`) is not
    drawn; the logprob stays the policy's."""
    logits = logits.float()
    if config.greedy:
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logp.argmax(dim=-1)  # a refused draft token is never the most likely one
    else:
        logp = torch.log_softmax(logits / config.temperature, dim=-1)
        probs = logp.exp() if refused is None else residual(logp.exp(), refused)
        chosen = inverse_cdf(probs.cpu(), generator).to(logits.device)
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
        draft: int = 0,
    ) -> None:
        self.model = model
        self.in_place = in_place
        """Decode into a cache with room reserved, logits at the last prompt position only (`sample_batch`);
        off, it measures the sampler before."""
        self.bf16 = bf16_by_default(model) if bf16 is None else bf16
        """Multiply the linear layers in bfloat16 (`BF16Matmuls`); by default where `bf16_by_default`."""
        self._matmuls: BF16Matmuls | None = None
        self.draft = draft
        """Tokens each decode pass also checks, looked up in the row's own context (`sample_batch`); 0: one
        token a pass."""
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
                        draft=self.draft,
                    )
            finally:
                self.model.train(was_training)
            return [
                Completion(tuple(p), s.token_ids, s.logprobs, self._policy_version)
                for p, s in zip(prompts, samples, strict=True)
            ]


__all__ = [
    "DRAFTED_PASS",
    "Sample",
    "TorchEngine",
    "decode",
    "draw",
    "inverse_cdf",
    "left_pad",
    "sample_batch",
]
