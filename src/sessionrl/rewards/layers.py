"""Reward layers, their weights, and the running normalisation of each layer.

Two schemes group the terms of a rule-set:

- `five_layer`: completion, efficiency (against the best known step count), risk, user experience and a
  long-term value proxy; each term names its layer.
- `three_layer`: rule, model and judge; a term's layer is its kind (CEL rules and the efficiency term are
  rules, the counterfactual rating is the model, comment corrections are the judge).

Each layer's raw total is standardised with the running mean and variance of the totals seen before it
(Welford's algorithm), so layers measured on different scales can be weighted against each other.

>>> s = RunningStats().update(1.0).update(2.0).update(3.0)
>>> (s.count, s.mean, round(s.variance, 4))
(3, 2.0, 0.6667)
>>> round(s.normalise(4.0, clip=5.0), 4)  # (4 - 2) / max(sqrt(2/3), 0.1)
2.4495
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class Scheme(StrEnum):
    """How terms are grouped into weighted layers."""

    FIVE_LAYER = "five_layer"
    THREE_LAYER = "three_layer"


class TermKind(StrEnum):
    """Where a term's signal comes from; it is the term's layer in the three-layer scheme."""

    RULE = "rule"
    MODEL = "model"
    JUDGE = "judge"


FIVE_LAYERS: tuple[str, ...] = ("completion", "efficiency", "risk", "experience", "long_term")
THREE_LAYERS: tuple[str, ...] = tuple(k.value for k in TermKind)

LAYERS: dict[Scheme, tuple[str, ...]] = {Scheme.FIVE_LAYER: FIVE_LAYERS, Scheme.THREE_LAYER: THREE_LAYERS}

DEFAULT_WEIGHTS: dict[Scheme, dict[str, float]] = {
    Scheme.FIVE_LAYER: {
        "completion": 1.0,
        "efficiency": 0.3,
        "risk": 1.0,
        "experience": 1.0,
        "long_term": 0.5,
    },
    Scheme.THREE_LAYER: {"rule": 1.0, "model": 0.5, "judge": 1.0},
}
"""Layer weights a rule file starts from; `layer_weights` in the file overrides them one by one."""

LONG_TERM_LAYERS = frozenset({"long_term"})
"""Layers that count towards the long-term reward only, not the immediate session reward."""

MIN_SCALE = 0.1
"""Smallest scale a layer is divided by: a layer that barely varies (say, hallucinations that never
happened) is not blown up by a near-zero standard deviation when it finally moves."""


@dataclass(frozen=True)
class RunningStats:
    """Count, mean and sum of squared deviations (M2) of the values seen so far; `update` returns a copy."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, x: float) -> RunningStats:
        """Welford's step: mean += (x - mean) / n; M2 += (x - old mean) · (x - new mean)."""
        count = self.count + 1
        delta = x - self.mean
        mean = self.mean + delta / count
        return RunningStats(count, mean, self.m2 + delta * (x - mean))

    @property
    def variance(self) -> float:
        """Population variance M2 / n (0 before any value)."""
        return self.m2 / self.count if self.count else 0.0

    @property
    def ready(self) -> bool:
        """Whether enough values were seen (two) for standardising to mean anything."""
        return self.count >= 2

    @property
    def scale(self) -> float:
        """max(sqrt(variance), `MIN_SCALE`) once ready, else 1."""
        return max(math.sqrt(self.variance), MIN_SCALE) if self.ready else 1.0

    def normalise(self, x: float, clip: float) -> float:
        """(x - mean) / scale clipped to ±clip once ready; x itself before that."""
        if not self.ready:
            return x
        return max(-clip, min(clip, (x - self.mean) / self.scale))


def layer_of(scheme: Scheme, kind: TermKind, layer: str) -> str:
    """The layer a term lands in: its own `layer` under five layers, its kind under three."""
    return layer if scheme is Scheme.FIVE_LAYER else kind.value
