"""Sparse feedback: predict the ratings nobody gave, ask people about the right sessions, and stage rewards.

- `RewardModel`: gradient boosting (scikit-learn) from session features to the 1–5 rating people give;
  it reports held-out MAE (against predicting the mean) and the AUC of telling ratings above 3 apart. As a
  `RatingPredictor` it feeds the `predicted_rating` term for unrated sessions.
- `uncertainty_queue`: the unrated sessions whose rating the model is least sure of (widest 10–90%
  quantile interval), which are the most useful ones to annotate next.
- `Curriculum`: which reward a training step uses: dense step signals first, then the binary rating
  (above 3 or not), then the full session reward.

>>> c = Curriculum(dense_until=100, binary_until=500)
>>> [c.phase(s).value for s in (0, 100, 499, 500)]
['dense', 'binary', 'binary', 'full']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.metrics import mean_absolute_error, roc_auc_score

from sessionrl.errors import SessionRLError
from sessionrl.rewards.terms import human_rating
from sessionrl.rewards.vector import RewardVector
from sessionrl.session.model import CallStatus, FeedbackType, Session, SessionState

GOOD_RATING = 3.0
"""Ratings above this count as good (for the AUC, the binary curriculum phase)."""


@dataclass(frozen=True)
class Featurizer:
    """Session → numeric features: counts, failures, latency, tokens, output provenance, automatic feedback,
    plus one feature per scenario, per tool (called successfully) and per numeric metadata key, with those
    vocabularies fixed when the model is fitted."""

    scenarios: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    metadata: tuple[str, ...] = ()

    @classmethod
    def fit(cls, sessions: Sequence[Session]) -> Featurizer:
        scenarios = sorted({s.scenario for s in sessions if s.scenario})
        tools = sorted({c.tool for s in sessions for c in s.tool_calls})
        numeric = sorted({k for s in sessions for k, v in s.metadata.items() if isinstance(v, int | float)})
        return cls(tuple(scenarios), tuple(tools), tuple(numeric))

    def __call__(self, session: Session) -> list[float]:
        calls = session.tool_calls
        kinds = [f.type for f in session.feedback]
        claims = session.final_output.claims if session.final_output is not None else ()
        ok_tools = {c.tool for c in calls if c.status is CallStatus.SUCCESS}
        validations = [f.score for f in session.feedback if f.type is FeedbackType.AUTO_VALIDATION]
        return [
            len(session.plan.subgoals) if session.plan is not None else 0,
            len(calls),
            sum(c.status is not CallStatus.SUCCESS for c in calls),
            sum(c.status is CallStatus.TIMEOUT for c in calls),
            sum(c.latency_ms for c in calls) / 1000.0,
            len(session.llm_calls),
            session.tokens_reported(),
            float(session.final_output is not None),
            sum(not c.call_ids for c in claims),
            float(session.state is SessionState.REJECTED),
            sum(1 for v in validations if v is not None and v >= 1.0),
            sum(1 for v in validations if v is not None and v < 1.0),
            kinds.count(FeedbackType.HALLUCINATION_PENALTY),
            kinds.count(FeedbackType.PLAN_REJECTION),
            *(float(session.scenario == s) for s in self.scenarios),
            *(float(t in ok_tools) for t in self.tools),
            *(_number(session.metadata.get(k)) for k in self.metadata),
        ]

    def matrix(self, sessions: Sequence[Session]) -> NDArray[np.float64]:
        return np.asarray([self(s) for s in sessions], dtype=np.float64)


def _number(value: object) -> float:
    """A metadata value as a number (bools count as 0/1; anything else as 0)."""
    return float(value) if isinstance(value, int | float) else 0.0


@dataclass(frozen=True)
class RewardModelConfig:
    """Gradient boosting settings and the held-out split."""

    n_estimators: int = 100
    max_depth: int = 2
    learning_rate: float = 0.05
    test_fraction: float = 0.25
    """Share of rated sessions held out for the report."""
    seed: int = 0
    min_rated: int = 20
    """Fewest rated sessions worth fitting on."""


@dataclass(frozen=True)
class ModelReport:
    """Held-out quality of a fitted reward model."""

    n_train: int
    n_test: int
    mae: float
    baseline_mae: float
    """MAE of always predicting the training mean: the model should beat it."""
    auc: float | None
    """AUC of the prediction for rating > 3 (None when the test set holds one class only)."""


class NotEnoughRatings(SessionRLError):
    """Too few rated sessions to fit a reward model."""


@dataclass
class RewardModel:
    """A counterfactual rating model with 10% and 90% quantile companions for uncertainty."""

    config: RewardModelConfig = field(default_factory=RewardModelConfig)
    featurizer: Featurizer = field(default_factory=Featurizer)
    _models: tuple[GradientBoostingRegressor, ...] = ()

    def fit(self, sessions: Sequence[Session]) -> ModelReport:
        """Fit on the rated sessions (a held-out share excluded) and report on that share."""
        rated = [(s, r.score) for s in sessions if (r := human_rating(s)) is not None]
        if len(rated) < self.config.min_rated:
            raise NotEnoughRatings(f"{len(rated)} rated sessions; need at least {self.config.min_rated}")
        self.featurizer = Featurizer.fit([s for s, _ in rated])
        x = self.featurizer.matrix([s for s, _ in rated])
        y = np.asarray([score for _, score in rated], dtype=np.float64)
        order = np.random.default_rng(self.config.seed).permutation(len(rated))
        n_test = max(1, int(len(rated) * self.config.test_fraction))
        test, train = order[:n_test], order[n_test:]
        self._models = tuple(self._fit_one(x[train], y[train], loss) for loss in ("squared_error", 0.1, 0.9))
        pred = self._models[0].predict(x[test])
        good = y[test] > GOOD_RATING
        auc = float(roc_auc_score(good, pred)) if 0 < good.sum() < len(good) else None
        baseline = float(mean_absolute_error(y[test], np.full(len(test), y[train].mean())))
        return ModelReport(len(train), len(test), float(mean_absolute_error(y[test], pred)), baseline, auc)

    def _fit_one(
        self, x: NDArray[np.float64], y: NDArray[np.float64], loss: str | float
    ) -> GradientBoostingRegressor:
        c = self.config
        kwargs = {"loss": "quantile", "alpha": loss} if isinstance(loss, float) else {"loss": loss}
        model = GradientBoostingRegressor(
            n_estimators=c.n_estimators,
            max_depth=c.max_depth,
            learning_rate=c.learning_rate,
            random_state=c.seed,
            **kwargs,
        )
        return model.fit(x, y)

    def predict(self, sessions: Sequence[Session]) -> NDArray[np.float64]:
        """Predicted ratings, clipped to [1, 5]."""
        predicted = np.asarray(self._fitted()[0].predict(self.featurizer.matrix(sessions)), dtype=np.float64)
        return np.clip(predicted, 1.0, 5.0)

    def predict_rating(self, session: Session) -> float:
        """The predicted rating of one session (the `RatingPredictor` protocol)."""
        return float(self.predict([session])[0])

    def interval(self, sessions: Sequence[Session]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """10% and 90% quantile predictions of the rating."""
        _, low, high = self._fitted()
        x = self.featurizer.matrix(sessions)
        return low.predict(x), high.predict(x)

    def _fitted(self) -> tuple[GradientBoostingRegressor, ...]:
        if not self._models:
            raise SessionRLError("the reward model is not fitted; call fit(sessions) first")
        return self._models


@dataclass(frozen=True)
class QueueItem:
    """An unrated session worth annotating: its predicted rating and the model's 10–90% interval."""

    session_id: str
    predicted: float
    low: float
    high: float

    @property
    def width(self) -> float:
        return self.high - self.low


def uncertainty_queue(model: RewardModel, sessions: Sequence[Session], k: int) -> list[QueueItem]:
    """The k unrated sessions with the widest predicted-rating interval, widest first (ties by id)."""
    unrated = [s for s in sessions if human_rating(s) is None]
    if not unrated or k <= 0:
        return []
    predicted = model.predict(unrated)
    low, high = model.interval(unrated)
    items = [
        QueueItem(s.session_id, float(p), float(min(lo, hi)), float(max(lo, hi)))
        for s, p, lo, hi in zip(unrated, predicted, low, high, strict=True)
    ]
    return sorted(items, key=lambda i: (-i.width, i.session_id))[:k]


class Phase(StrEnum):
    """Curriculum phases, in order."""

    DENSE = "dense"
    BINARY = "binary"
    FULL = "full"


@dataclass(frozen=True)
class Curriculum:
    """Which reward a training step learns from: dense → binary rating → full."""

    dense_until: int = 1_000
    """Steps before this use the dense per-step signals only."""
    binary_until: int = 5_000
    """Steps before this (and after `dense_until`) use the binary rating."""

    def __post_init__(self) -> None:
        if not 0 <= self.dense_until <= self.binary_until:
            raise ValueError("need 0 <= dense_until <= binary_until")

    def phase(self, step: int) -> Phase:
        """The phase of a training step."""
        if step < self.dense_until:
            return Phase.DENSE
        return Phase.BINARY if step < self.binary_until else Phase.FULL

    def target(self, vector: RewardVector, step: int) -> float:
        """The scalar reward of a session at a training step.

        dense: sum of the step rewards; binary: +1 if the rating is above 3, -1 if not, 0 when unrated;
        full: the session reward.
        """
        phase = self.phase(step)
        if phase is Phase.DENSE:
            return sum(vector.step_rewards.values())
        if phase is Phase.BINARY:
            return 0.0 if vector.rating is None else (1.0 if vector.rating > GOOD_RATING else -1.0)
        return vector.session_reward
