"""GRPO: group-relative policy optimisation over sessions.

K sessions attempt the same task with the same policy version; each session's advantage is its reward
against the mean and std of its group (`losses.group_advantages`), spread over the tokens it produced
(`sessionrl.train.llm.data.call_advantages`). The update is the PPO clipped surrogate, plus an optional KL
penalty to a frozen reference (the imitation checkpoint) with a decaying coefficient.

The sessions were sampled by a behaviour policy that is not quite the trained one: an inference engine
scores tokens with other kernels and precision, and a session scored late was sampled by an older
version. The surrogate's ratio is taken against the trainer's own log-probabilities before the step (the
proximal policy), and each token is reweighted from the sampler's distribution to the trainer's by
truncated importance sampling, ``w = min(π_trainer / π_sampler, is_cap)`` on the log-probabilities the
sampler recorded (`losses.truncated_importance_weights`). Tokens without a recorded log-probability
train on-policy (``w = 1``); their share is reported with the mismatch (`is_missing`, `is_abs_diff`,
`is_truncated`, and the mean weight `is_weight`, in each update's diagnostics).

Two settings keep a small policy from unlearning what imitation taught it. `negative_weight` scales the
advantages below zero: when most of a weak policy's episodes fail, pushing down every token of every
failed reply also pushes down the tokens those replies share with good ones (the format, the ids it
copied right), and the policy drifts away from acting at all; at 0 the update only raises replies that
did better than their group, an expert-iteration step weighted by the group's advantage. `optimizer`
picks AdamW or plain SGD: a fresh AdamW moves every parameter with any gradient by about `lr` on its first
steps, however faint that gradient is, while SGD moves each parameter in proportion to its own gradient.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from sessionrl.train.llm.data import MicroBatch, PackedBatch, TokenSequence, packed
from sessionrl.train.llm.update import (
    TokenScorer,
    UpdateStats,
    accumulate,
    build_optimizer,
    local_sequences,
    token_logprobs,
    trainable,
)
from sessionrl.train.losses import (
    clipped_pg_loss,
    decaying_beta,
    kl_penalty,
    masked_mean,
    truncated_importance_weights,
)

REWARD_KEY = re.compile(r"session|long_term|(layer|term):\w+")
OPTIMIZERS = ("adamw", "sgd")


@dataclass(frozen=True, slots=True)
class GRPOConfig:
    """Reinforcement-learning settings."""

    lr: float = field(
        default=1e-4,
        metadata={"help": "learning rate (5e-4 unlearned a tiny model's imitation in 8 iterations)"},
    )
    optimizer: str = field(
        default="adamw",
        metadata={
            "help": "adamw, or sgd (steps along the gradient itself, so parameters the rewards barely "
            "touch barely move)"
        },
    )
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    group_size: int = field(default=4, metadata={"help": "sessions per task and policy version (K)"})
    clip_eps: float = field(default=0.2, metadata={"help": "PPO ratio clip ε"})
    is_cap: float = field(
        default=2.0,
        metadata={"help": "cap c of each token's importance weight min(π_trainer / π_sampler, c)"},
    )
    epochs: int = field(default=1, metadata={"help": "optimiser steps per batch of sessions"})
    kl_coef: float = field(default=0.0, metadata={"help": "β of the KL penalty to the reference (0: none)"})
    kl_decay: float = field(default=1.0, metadata={"help": "β is multiplied by this after every update"})
    step_coef: float = field(
        default=0.0, metadata={"help": "weight of per-step rewards in a call's advantage"}
    )
    negative_weight: float = field(
        default=1.0,
        metadata={
            "help": "weight of negative advantages (1: plain GRPO; 0: learn only from replies that did "
            "better than their group)"
        },
    )
    reward: str = field(
        default="long_term",
        metadata={"help": "what ranks a group: session, long_term, layer:<name> (raw) or term:<name>"},
    )
    temperature: float = field(
        default=1.0, metadata={"help": "sampling temperature the logprobs were taken at"}
    )
    token_budget: int = field(default=8192, metadata={"help": "tokens per micro-batch, laid end to end"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient norm clip"})

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.group_size < 2 or self.epochs < 1 or self.temperature <= 0:
            raise ValueError("GRPOConfig needs lr > 0, group_size >= 2, epochs >= 1 and temperature > 0")
        if not REWARD_KEY.fullmatch(self.reward):
            raise ValueError(
                f"GRPOConfig.reward must be session, long_term, layer:<name> or term:<name>: {self.reward!r}"
            )
        if self.clip_eps <= 0 or self.kl_coef < 0 or not 0 < self.kl_decay <= 1 or self.token_budget < 16:
            raise ValueError(
                "GRPOConfig needs clip_eps > 0, kl_coef >= 0, 0 < kl_decay <= 1, token_budget >= 16"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"GRPOConfig.optimizer must be one of {OPTIMIZERS}: {self.optimizer!r}")
        if not 0 <= self.negative_weight <= 1:
            raise ValueError(f"GRPOConfig.negative_weight must lie in [0, 1]: {self.negative_weight}")
        if self.is_cap < 1:
            raise ValueError(f"GRPOConfig.is_cap must be at least 1: {self.is_cap}")

    def moves(self, advantages: Sequence[float]) -> bool:
        """Whether a sequence with these advantages moves the policy at all (without a KL term, one whose
        weighted advantages are all zero carries no gradient and need not be computed)."""
        return self.kl_coef > 0 or any(a > 0 or (a < 0 and self.negative_weight > 0) for a in advantages)


class GRPOTrainer:
    """One `step` per batch of scored sessions (as token sequences carrying advantages and old logprobs)."""

    def __init__(self, model: Any, config: GRPOConfig, pad_id: int, reference: Any | None = None) -> None:
        self.model = model
        self.scorer: torch.nn.Module = TokenScorer(model, config.temperature)
        """What the loss reads the policy's log-probabilities through (DDP's when data-parallel)."""
        self.config = config
        self.pad_id = pad_id
        self.optimizer: torch.optim.Optimizer = (
            build_optimizer(model, config.lr, config.weight_decay)
            if config.optimizer == "adamw"
            else torch.optim.SGD(trainable(model), lr=config.lr, weight_decay=config.weight_decay)
        )
        self.reference = reference
        if config.kl_coef > 0 and reference is None:
            self.reference = frozen_copy(model)
        self.updates = 0
        """Optimiser steps taken; the KL coefficient decays with it."""

    @property
    def beta(self) -> float:
        """The KL coefficient now."""
        return decaying_beta(self.updates, self.config.kl_coef, self.config.kl_decay)

    def loss(self, micro: MicroBatch) -> tuple[Tensor, dict[str, float]]:
        """Clipped policy-gradient loss, importance-weighted from the sampler to the trainer (plus β·KL to
        the reference), over the micro-batch's policy tokens. The ratio's anchor is `micro.proximal`, or
        without it the current log-probabilities (the first epoch's, taken as constants)."""
        cfg = self.config
        logp = self.scorer(micro)
        proximal = logp.detach() if micro.proximal is None else micro.proximal
        iw = truncated_importance_weights(
            proximal, micro.old_logprobs, micro.loss_mask, cfg.is_cap, micro.recorded
        )
        advantages = micro.advantages
        if cfg.negative_weight != 1:
            advantages = torch.where(advantages < 0, advantages * cfg.negative_weight, advantages)
        pg = clipped_pg_loss(logp, proximal, advantages, micro.loss_mask, cfg.clip_eps, iw.weights)
        parts = {
            "pg_loss": pg.loss.item(),
            "clip_fraction": pg.clip_fraction,
            "approx_kl": pg.approx_kl,
            "is_abs_diff": iw.mean_abs_diff,
            "is_truncated": iw.truncated_fraction,
            "is_missing": iw.missing_fraction,
            "is_weight": mean_weight(iw.weights, micro),
        }
        loss = pg.loss
        if self.reference is not None and self.beta > 0:
            with torch.no_grad():
                ref = token_logprobs(self.reference, micro, self.config.temperature)
            kl = kl_penalty(logp, ref, micro.loss_mask)
            loss = loss + self.beta * kl
            parts["kl_ref"] = kl.item()
        return loss, parts

    def step(self, sequences: Sequence[TokenSequence]) -> UpdateStats:
        """`config.epochs` optimiser steps on `sequences`; returns the last step's statistics."""
        batch = packed(local_sequences(sequences), self.config.token_budget)
        if self.config.epochs > 1:
            batch = self._anchored(batch)
        return [self._update(batch) for _ in range(self.config.epochs)][-1]

    def _anchored(self, batch: PackedBatch) -> PackedBatch:
        """`batch` with the trainer's log-probabilities as they are before the step (`proximal`), which
        every epoch's ratio is taken against."""
        device = next(self.model.parameters()).device
        with torch.no_grad():
            micro = tuple(
                dataclasses.replace(
                    m, proximal=token_logprobs(self.model, m.to(device), self.config.temperature)
                )
                for m in batch
            )
        return dataclasses.replace(batch, micro=micro)

    def _update(self, batch: PackedBatch) -> UpdateStats:
        stats = accumulate(self.scorer, self.optimizer, batch, self.loss, self.config.max_grad_norm)
        self.updates += 1
        return stats


def mean_weight(weights: Tensor, micro: MicroBatch) -> float:
    """Mean importance weight over the micro-batch's policy tokens that have a recorded log-probability
    (`weights`, ``[B, T]``, as `truncated_importance_weights` gives them)."""
    mask = micro.loss_mask.bool()
    if micro.recorded is not None:
        mask = mask & micro.recorded.bool()
    return float(masked_mean(weights, mask).item())


def frozen_copy(model: Any) -> Any:
    """A copy of `model` with gradients off, in eval mode (the KL reference)."""
    reference = copy.deepcopy(model)
    reference.eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference


__all__ = ["GRPOConfig", "GRPOTrainer", "frozen_copy"]
