"""Supervised fine-tuning (imitation): raise the likelihood of the expert's actions, token by token.

The data are expert sessions rendered as the turns a policy should produce
(`sessionrl.train.llm.data.demonstration_turns`); only the action tokens are trained.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor
from torch.nn import Module

from sessionrl.train.llm.data import MicroBatch, TokenSequence, packed
from sessionrl.train.llm.update import (
    TokenScorer,
    UpdateStats,
    accumulate,
    build_optimizer,
    local_sequences,
)
from sessionrl.train.losses import masked_mean


@dataclass(frozen=True, slots=True)
class SFTConfig:
    """Imitation settings."""

    lr: float = field(default=2e-3, metadata={"help": "AdamW learning rate"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    steps: int = field(default=60, metadata={"help": "optimiser steps of the imitation stage"})
    batch_sessions: int = field(default=16, metadata={"help": "demonstration sessions per optimiser step"})
    token_budget: int = field(default=8192, metadata={"help": "tokens per micro-batch, laid end to end"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient norm clip"})
    warmup_steps: int = field(default=10, metadata={"help": "steps of linear warm-up to `lr`"})
    cosine: bool = field(default=True, metadata={"help": "decay the rate to 0 by `steps` on a half cosine"})

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.steps < 0 or self.batch_sessions < 1 or self.token_budget < 16:
            raise ValueError("SFTConfig needs lr > 0, steps >= 0, batch_sessions >= 1 and token_budget >= 16")
        if self.warmup_steps < 0:
            raise ValueError(f"SFTConfig.warmup_steps must be >= 0, got {self.warmup_steps}")

    def lr_at(self, step: int) -> float:
        """The learning rate of optimiser step `step` (0-based): warm-up, then constant or half-cosine.

        >>> config = SFTConfig(lr=1.0, steps=10, warmup_steps=2)
        >>> [round(config.lr_at(s), 3) for s in (0, 1, 2, 6, 10)]
        [0.5, 1.0, 1.0, 0.5, 0.0]
        """
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if not self.cosine:
            return self.lr
        span = max(self.steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        return self.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


class SFTTrainer:
    """Cross-entropy on policy tokens; one `step` is one optimiser step over a batch of sequences."""

    def __init__(self, model: Any, config: SFTConfig, pad_id: int) -> None:
        self.model = model
        self.scorer: Module = TokenScorer(model)
        """What the loss reads the policy's log-probabilities through (DDP's when data-parallel)."""
        self.config = config
        self.pad_id = pad_id
        self.optimizer = build_optimizer(model, config.lr, config.weight_decay)
        self.steps = 0
        """Optimiser steps taken (the learning-rate schedule reads it; a resumed run sets it)."""

    def loss(self, micro: MicroBatch) -> tuple[Tensor, dict[str, float]]:
        """Mean negative log-likelihood of the micro-batch's policy tokens."""
        nll = -masked_mean(self.scorer(micro), micro.loss_mask)
        return nll, {}

    def step(self, sequences: Sequence[TokenSequence]) -> UpdateStats:
        """One optimiser step on `sequences`, packed by the token budget."""
        batch = packed(local_sequences(sequences), self.config.token_budget)
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr_at(self.steps)
        stats = accumulate(self.scorer, self.optimizer, batch, self.loss, self.config.max_grad_norm)
        self.steps += 1
        return stats


__all__ = ["SFTConfig", "SFTTrainer"]
