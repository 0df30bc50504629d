"""What every trainer does with a packed batch: token log-probabilities, and one accumulated update.

A batch is split into micro-batches (`sessionrl.train.llm.data.packed`). Each micro-batch's loss is a mean
over its own policy tokens; scaled by its share of the batch's policy tokens, the summed gradients equal
those of one token-level mean over the whole batch, whatever the packing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from sessionrl.train.llm.data import MicroBatch, PackedBatch

LossFn = Callable[[MicroBatch], tuple[Tensor, dict[str, float]]]
"""A micro-batch's loss (token mean over its policy tokens) and diagnostics to average the same way."""


def token_logprobs(model: Any, batch: MicroBatch, temperature: float = 1.0) -> Tensor:
    """``logp[b, t] = log softmax(logits[b, t-1] / temperature)[input_ids[b, t]]`` where ``loss_mask[b, t]``
    is set, 0 elsewhere; shape ``[B, T]``.

    Only the positions that predict a policy token go through the output layer: the decoder's hidden
    states are gathered there first, so the vocabulary-sized logits exist for policy tokens alone (a
    fraction of a session's tokens). Models that reshape their logits in their own forward (soft-capping,
    scaling) take the plain path instead.
    """
    targets = batch.loss_mask[:, 1:]
    if _plain_head(model):
        decoder, head = model.get_decoder(), model.get_output_embeddings()
        hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        logits = head(hidden[:, :-1][targets]).float()
    else:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        logits = out.logits[:, :-1][targets].float()
    if temperature != 1.0:
        logits = logits / temperature
    wanted = batch.input_ids[:, 1:][targets]
    picked = logits.gather(-1, wanted[:, None]).squeeze(-1) - logits.logsumexp(-1)
    logp = torch.zeros(targets.shape, dtype=picked.dtype, device=picked.device)
    logp = logp.masked_scatter(targets, picked)
    return F.pad(logp, (1, 0))


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
    padding: float


def accumulate(
    model: Any, optimizer: torch.optim.Optimizer, batch: PackedBatch, loss_fn: LossFn, max_grad_norm: float
) -> UpdateStats:
    """One optimiser step over every micro-batch of `batch` (gradients accumulated token-weighted)."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    total = max(batch.policy_tokens, 1)
    loss_sum = 0.0
    parts: dict[str, float] = {}
    for micro in batch:
        share = micro.policy_tokens / total
        if share == 0:
            continue
        loss, extra = loss_fn(micro.to(device))
        torch.autograd.backward(loss * share)
        loss_sum += loss.item() * share
        for name, value in extra.items():
            parts[name] = parts.get(name, 0.0) + value * share
    norm = torch.nn.utils.clip_grad_norm_(_params(optimizer), max_grad_norm)
    optimizer.step()
    return UpdateStats(loss_sum, parts, float(norm), batch.policy_tokens, batch.tokens, batch.padding)


def _params(optimizer: torch.optim.Optimizer) -> Iterable[Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


__all__ = ["LossFn", "UpdateStats", "accumulate", "build_optimizer", "token_logprobs", "trainable"]
