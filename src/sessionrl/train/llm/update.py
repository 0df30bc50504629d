"""What every trainer does with a packed batch: token log-probabilities, and one accumulated update.

A batch is split into micro-batches (`sessionrl.train.llm.data.packed`). Each micro-batch's loss is a mean
over its own policy tokens; scaled by its share of the batch's policy tokens, the summed gradients equal
those of one token-level mean over the whole batch, whatever the packing.

The loss reads log-probabilities through the trainer's `TokenScorer`, a module whose forward pass is
`token_logprobs`. Data-parallel (a `torch.distributed` process group is up, gloo on CPU or NCCL on GPUs),
the scorer is wrapped in torch's `DistributedDataParallel` (`data_parallel`), every rank is handed the
whole batch of sequences and trains on its `shard` (`local_sequences`). Shares are taken of the policy
tokens of all ranks together; each rank accumulates its micro-batches' gradients locally (`no_sync`) and
DDP all-reduces them in the backward pass of its last one, so every rank takes the same step as one
process would on the whole batch. A rank whose shard is empty still joins that all-reduce, with zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch import distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from sessionrl.policy.products import FrozenBF16Matmuls, bf16_by_default
from sessionrl.train.llm.data import MicroBatch, PackedBatch, TokenSequence, concatenate, shard
from sessionrl.train.llm.packing import packed_kwargs, use_packed_attention

LossFn = Callable[[MicroBatch], tuple[Tensor, dict[str, float]]]
"""A micro-batch's loss (token mean over its policy tokens) and diagnostics to average the same way."""


def token_logprobs(model: Any, batch: MicroBatch, temperature: float = 1.0) -> Tensor:
    """``logp[b, t] = log softmax(logits[b, t-1] / temperature)[input_ids[b, t]]`` where ``loss_mask[b, t]``
    is set, 0 elsewhere; shape ``[B, T]``.

    Only the positions that predict a policy token go through the output layer: the decoder's hidden
    states are gathered there first, so the vocabulary-sized logits exist for policy tokens alone (a
    fraction of a session's tokens). Models that reshape their logits in their own forward (soft-capping,
    scaling) take the plain path instead. A packed micro-batch runs with segment attention
    (`sessionrl.train.llm.packing`), a padded one with its attention mask. The weights that do not train
    (a LoRA model's base) are multiplied in bfloat16 where `bf16_by_default` (`FrozenBF16Matmuls`), as
    the sampler multiplies them.
    """
    targets = batch.loss_mask[:, 1:]
    inputs = _model_inputs(model, batch)
    with FrozenBF16Matmuls(model) if bf16_by_default(model) else nullcontext():
        if _plain_head(model):
            decoder, head = model.get_decoder(), model.get_output_embeddings()
            hidden = decoder(**inputs).last_hidden_state
            logits = head(hidden[:, :-1][targets]).float()
        else:
            logits = model(**inputs).logits[:, :-1][targets].float()
    plan = inputs.get("segment_plan")
    if plan is not None and not plan.calls:
        raise RuntimeError(
            f"{type(model).__name__} did not take the packed attention (its attention does not go through "
            "transformers' attention interface): train it on padded micro-batches (`collate`)"
        )
    if temperature != 1.0:
        logits = logits / temperature
    wanted = batch.input_ids[:, 1:][targets]
    picked = logits.gather(-1, wanted[:, None]).squeeze(-1) - logits.logsumexp(-1)
    logp = torch.zeros(targets.shape, dtype=picked.dtype, device=picked.device)
    logp = logp.masked_scatter(targets, picked)
    return F.pad(logp, (1, 0))


def _model_inputs(model: Any, batch: MicroBatch) -> dict[str, Any]:
    """The forward pass's arguments for either layout (no cache: nothing is decoded after it); a packed
    one switches `model` to the segment attention first."""
    if batch.segments is not None and batch.position_ids is not None:
        use_packed_attention(model)
        packing = packed_kwargs(batch.position_ids, batch.segments, batch.parents)
        return {"input_ids": batch.input_ids, **packing}
    return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "use_cache": False}


def _plain_head(model: Any) -> bool:
    """Whether the model's logits are just its output layer applied to its decoder's last hidden state."""
    config = getattr(model, "config", None)
    reshaped = any(getattr(config, name, None) for name in ("final_logit_softcapping", "logit_scale"))
    return not reshaped and hasattr(model, "get_decoder") and model.get_output_embeddings() is not None


def trainable(model: Any) -> list[torch.nn.Parameter]:
    """The parameters an optimiser should move (LoRA adapters only, when the model has them)."""
    return [p for p in model.parameters() if p.requires_grad]


def build_optimizer(model: Any, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over the trainable parameters."""
    return torch.optim.AdamW(trainable(model), lr=lr, weight_decay=weight_decay)


@dataclass(frozen=True, slots=True)
class UpdateStats:
    """What one optimiser step saw: the loss, named diagnostics, the gradient norm and the data's shape."""

    loss: float
    parts: dict[str, float]
    grad_norm: float
    policy_tokens: int
    tokens: int

    def as_record(self) -> dict[str, Any]:
        """The step's line of metrics.jsonl: the loss, its parts, the gradient norm and the token counts."""
        return {
            "loss": self.loss,
            **self.parts,
            "grad_norm": self.grad_norm,
            "policy_tokens": self.policy_tokens,
            "tokens": self.tokens,
        }


class TokenScorer(torch.nn.Module):
    """`token_logprobs` of a model as a module's forward pass, the unit DDP wraps."""

    def __init__(self, model: Any, temperature: float = 1.0) -> None:
        super().__init__()
        self.model = model
        self.temperature = temperature

    def forward(self, batch: MicroBatch) -> Tensor:
        """``[B, T]`` log-probabilities of the batch's policy tokens (see `token_logprobs`)."""
        return token_logprobs(self.model, batch, self.temperature)


def data_parallel(scorer: torch.nn.Module) -> torch.nn.Module:
    """`scorer` wrapped in `DistributedDataParallel` when ranks train together (as it is otherwise).

    Every rank must call it at the same point: DDP starts by giving every rank rank 0's weights. Buffers
    are not broadcast (rotary tables and the like are computed alike everywhere), so a rank's forward
    passes need no other rank.
    """
    if world_size() == 1 or isinstance(scorer, DistributedDataParallel):
        return scorer
    cuda = next(scorer.parameters()).device.type == "cuda"
    devices = [torch.cuda.current_device()] if cuda else None
    return DistributedDataParallel(scorer, device_ids=devices, forward_sync_buffers=False)


def accumulate(
    scorer: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: PackedBatch,
    loss_fn: LossFn,
    max_grad_norm: float,
) -> UpdateStats:
    """One optimiser step over every micro-batch of `batch` (gradients accumulated token-weighted), the
    loss reading `scorer` (the model itself in one process); this rank's part of one step over all ranks'
    batches when data-parallel, where `scorer` is DDP's (see the module doc)."""
    world = world_size()
    ddp = scorer if isinstance(scorer, DistributedDataParallel) else None
    if world > 1 and ddp is None:
        raise ValueError("data-parallel training needs the scorer wrapped by `data_parallel`")
    scorer.train()
    optimizer.zero_grad(set_to_none=True)
    device = next(scorer.parameters()).device
    policy_tokens, tokens = (int(n) for n in _across_ranks([batch.policy_tokens, batch.tokens], device))
    total = max(policy_tokens, 1)
    work = [(micro, micro.policy_tokens / total) for micro in batch if micro.policy_tokens > 0]
    if not work and ddp is not None:
        work = [(_empty_shard_batch(), 0.0)]  # joins the all-reduce with zeros; names the diagnostics
    loss_sum = 0.0
    parts: dict[str, float] = {}
    for i, (micro, share) in enumerate(work):
        local = ddp is not None and i < len(work) - 1
        with ddp.no_sync() if ddp is not None and local else nullcontext():
            loss, extra = loss_fn(micro.to(device))
            torch.autograd.backward(loss * (share * world))  # DDP averages over the ranks: × world sums
        loss_sum += loss.item() * share
        for name, value in extra.items():
            parts[name] = parts.get(name, 0.0) + value * share
    names = sorted(parts)
    loss_sum, *summed = _across_ranks([loss_sum, *(parts[n] for n in names)], device)
    norm = torch.nn.utils.clip_grad_norm_(_params(optimizer), max_grad_norm)
    optimizer.step()
    return UpdateStats(loss_sum, dict(zip(names, summed, strict=True)), float(norm), policy_tokens, tokens)


def _empty_shard_batch() -> MicroBatch:
    """A two-token micro-batch with one policy token, for a rank with nothing of its own to train on."""
    return concatenate([TokenSequence((0, 0), (False, True), (0.0, 0.0), (0.0, 0.0))])


def world_size() -> int:
    """How many ranks train together (1 without a process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def local_sequences(sequences: Sequence[TokenSequence]) -> list[TokenSequence]:
    """The sequences this rank trains on: all of them in one process, its `shard` when data-parallel."""
    world = world_size()
    if world == 1:
        return list(sequences)
    return [sequences[i] for i in shard([len(s) for s in sequences], dist.get_rank(), world)]


def _across_ranks(values: Sequence[float], device: torch.device) -> list[float]:
    """`values` summed over every rank (as they are in one process)."""
    if world_size() == 1:
        return list(values)
    summed = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(summed)
    return [float(v) for v in summed.tolist()]


def _params(optimizer: torch.optim.Optimizer) -> Iterable[Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


__all__ = [
    "LossFn",
    "TokenScorer",
    "UpdateStats",
    "accumulate",
    "build_optimizer",
    "data_parallel",
    "local_sequences",
    "token_logprobs",
    "trainable",
    "world_size",
]
