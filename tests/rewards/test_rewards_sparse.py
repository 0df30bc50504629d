"""Sparse feedback: the counterfactual reward model, the annotation queue and the curriculum."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sessionrl.rewards.layers import Scheme
from sessionrl.rewards.sparse import Curriculum, NotEnoughRatings, Phase, RewardModel, uncertainty_queue
from sessionrl.rewards.terms import human_rating
from sessionrl.rewards.vector import RewardVector
from sessionrl.session import Session, fold
from sessionrl.store.synthetic import session_events


@pytest.fixture(scope="module")
def traffic() -> list[Session]:
    return [fold(session_events(1, i)) for i in range(1000)]


@pytest.fixture(scope="module")
def model(traffic: list[Session]) -> RewardModel:
    model = RewardModel()
    model.fit(traffic)
    return model


def test_reward_model_beats_the_mean_on_held_out_ratings(traffic: list[Session]) -> None:
    report = RewardModel().fit(traffic)
    rated = sum(human_rating(s) is not None for s in traffic)
    assert report.n_train + report.n_test == rated
    assert report.n_test == int(rated * 0.25)
    assert report.mae < report.baseline_mae  # better than always predicting the training mean
    assert report.auc is not None
    assert report.auc > 0.7  # ranks good (> 3) sessions above the others


def test_predictions_are_ratings(model: RewardModel, traffic: list[Session]) -> None:
    predicted = model.predict(traffic[:50])
    assert predicted.min() >= 1.0
    assert predicted.max() <= 5.0
    assert model.predict_rating(traffic[0]) == pytest.approx(predicted[0])


def test_too_few_ratings_is_an_error(traffic: list[Session]) -> None:
    with pytest.raises(NotEnoughRatings, match="need at least 20"):
        RewardModel().fit(traffic[:10])


def test_uncertainty_queue_lists_the_least_certain_unrated_sessions(
    model: RewardModel, traffic: list[Session]
) -> None:
    queue = uncertainty_queue(model, traffic, k=5)
    unrated = {s.session_id for s in traffic if human_rating(s) is None}
    assert len(queue) == 5
    assert {item.session_id for item in queue} <= unrated
    widths = [item.width for item in queue]
    assert widths == sorted(widths, reverse=True)
    all_items = uncertainty_queue(model, traffic, k=len(traffic))
    assert len(all_items) == len(unrated)
    assert widths[0] == max(i.width for i in all_items)
    assert uncertainty_queue(model, traffic, k=5) == queue  # deterministic


def vector(rating: float | None, steps: dict[str, float], session_reward: float) -> RewardVector:
    return RewardVector(
        session_id="s",
        session_version=1,
        ruleset_version="r@1",
        scheme=Scheme.FIVE_LAYER,
        scored_at=datetime(2025, 1, 1, tzinfo=UTC),
        rating=rating,
        step_rewards=steps,
        session_reward=session_reward,
        long_term_reward=session_reward,
        layers={},
        terms=(),
    )


def test_curriculum_phases_and_targets() -> None:
    c = Curriculum(dense_until=10, binary_until=20)
    assert [c.phase(s) for s in (0, 9, 10, 19, 20, 10_000)] == [
        Phase.DENSE,
        Phase.DENSE,
        Phase.BINARY,
        Phase.BINARY,
        Phase.FULL,
        Phase.FULL,
    ]
    v = vector(4.0, {"t1": -0.5, "t2": 0.25}, 0.8)
    assert c.target(v, 0) == pytest.approx(-0.25)  # dense: -0.5 + 0.25
    assert c.target(v, 10) == 1.0  # binary: 4 > 3
    assert c.target(vector(3.0, {}, 0.8), 10) == -1.0  # 3 is not above 3
    assert c.target(vector(None, {}, 0.8), 10) == 0.0  # unrated
    assert c.target(v, 20) == 0.8  # full: the session reward


def test_curriculum_bounds_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="dense_until <= binary_until"):
        Curriculum(dense_until=10, binary_until=5)
