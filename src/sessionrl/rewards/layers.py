"""Reward layers, their weights, and the running normalisation of each layer.

Two schemes group the terms of a rule-set:

- `five_layer`: completion, efficiency (against the best known step count), risk, user experience and a
  long-term value proxy; each term names its layer.
- `three_layer`: rule, model and judge; a term's layer is its kind (CEL rules and the efficiency term are
  rules, the counterfactual rating is the model, comment corrections are the judge).

Each layer's raw total is centred on the running mean of the totals seen before it and divided by their
standard deviation where that exceeds 1 (Welford's algorithm keeps both), so a layer that spreads widely
is brought down to a unit spread while a quiet one is never blown up. The mean starts from a prior of
`PRIOR_SESSIONS` pseudo-totals of 0, so the first sessions pass nearly unchanged and the mean moves to the
observed one as sessions accumulate. A total is thus worth about the same whether the normaliser had seen
two sessions or two thousand, mostly unrated ones included.

>>> s = RunningStats().update(1.0).update(2.0).update(3.0)
>>> (s.count, s.mean, round(s.variance, 4))
(3, 2.0, 0.6667)
>>> round(s.centre, 4), s.scale  # 3 · 2 / (3 + 10); the spread, sqrt(2/3), is below 1
(0.4615, 1.0)
>>> round(s.normalise(4.0, clip=5.0), 4)  # (4 - 0.4615) / 1
3.5385
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

MIN_SCALE = 1.0
"""Smallest scale a layer is divided by: the normaliser shrinks a layer that spreads more than this, and
never blows up one that barely varies (ratings on a few sessions of many, hallucinations that rarely
happen)."""

PRIOR_SESSIONS = 10
"""Pseudo-totals of 0 the running mean starts from: after n sessions of mean m it centres on n·m / (n + 10),
so the first sessions are not judged against a mean of one or two values."""


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
    def centre(self) -> float:
        """The mean a value is centred on: the values' mean shrunk towards 0 by `PRIOR_SESSIONS`."""
        return self.count * self.mean / (self.count + PRIOR_SESSIONS)

    @property
    def scale(self) -> float:
        """max(sqrt(variance), `MIN_SCALE`)."""
        return max(math.sqrt(self.variance), MIN_SCALE)

    def normalise(self, x: float, clip: float) -> float:
        """(x - centre) / scale clipped to ±clip (x itself, clipped, before any value was seen)."""
        return max(-clip, min(clip, (x - self.centre) / self.scale))


def layer_of(scheme: Scheme, kind: TermKind, layer: str) -> str:
    """The layer a term lands in: its own `layer` under five layers, its kind under three."""
    return layer if scheme is Scheme.FIVE_LAYER else kind.value
