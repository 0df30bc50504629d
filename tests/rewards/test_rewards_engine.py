"""The engine end to end: the worked example, versioned storage, late feedback, the change feed, stats."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from rewards_support import EN_COMMENT, T0, ZH_COMMENT, at, build, events, feedback, tool

from sessionrl.rewards.engine import RewardConfig, RewardEngine
from sessionrl.rewards.vector import RewardVector
from sessionrl.session import Anchor, CallStatus, Event, FeedbackAdded, FeedbackType, Session, SessionCreated
from sessionrl.store import SessionStore

FT = FeedbackType


@pytest.fixture
def engine() -> RewardEngine:
    return RewardEngine(clock=lambda: T0 + timedelta(days=1))


@pytest.fixture
def store() -> Iterator[SessionStore]:
    with SessionStore.open("sqlite://") as s:
        yield s


def put(store: SessionStore, log: list[Event]) -> None:
    session_id = build_id(log)
    results = store.append_batch([(session_id, e, None) for e in log])
    assert all(isinstance(r, Session) for r in results), results


def build_id(log: list[Event]) -> str:
    first = log[0]
    assert isinstance(first, SessionCreated)
    return first.session_id


def term(vector: RewardVector, name: str) -> float:
    return next(t.value for t in vector.terms if t.name == name)


@pytest.mark.parametrize("comment", [ZH_COMMENT, EN_COMMENT])
def test_worked_example(engine: RewardEngine, comment: str) -> None:
    session = build([tool("t1")], [feedback(FT.HUMAN_RATING, 4.0, comment)])
    vector = engine.score(session)
    assert term(vector, "human_rating") == pytest.approx(0.5)  # (4 - 3) / 2
    assert term(vector, "judge_correction") == pytest.approx(-0.2)  # chronic_disease_exclusion, high
    assert vector.rating == 4.0
    assert vector.scored_at == T0 + timedelta(days=1)  # the injected clock
    # first session seen: centre 0 and scale 1, so experience = 0.5 - 0.2 = 0.3, weight 1
    assert vector.layers["experience"].raw == pytest.approx(0.3)
    assert vector.layers["experience"].contribution == pytest.approx(0.3)


def test_late_feedback_makes_a_new_version_and_the_old_one_stays(
    engine: RewardEngine, store: SessionStore
) -> None:
    put(store, events([tool("t1"), tool("t2", status=CallStatus.ERROR, start=3)]))
    first = engine.score_and_store(store, "s1")
    assert (first.version, first.new) == (1, True)
    again = engine.score_and_store(store, "s1")
    assert (again.version, again.new) == (1, False)  # nothing changed: nothing written
    v1 = RewardVector.model_validate(store.reward("s1", 1).vector)
    assert v1.rating is None

    late = feedback(FT.HUMAN_RATING, 5.0, EN_COMMENT, occurred=86_400.0, delay=10.0)
    store.append("s1", FeedbackAdded(feedback=late, at=late.received_at))
    second = engine.score_and_store(store, "s1")
    assert (second.version, second.new) == (2, True)

    assert [r.version for r in store.rewards("s1")] == [1, 2]
    assert (
        RewardVector.model_validate(store.reward("s1", 1).vector) == v1
    )  # version 1 still readable, unchanged
    v2 = RewardVector.model_validate(store.reward("s1").vector)
    assert v2.rating == 5.0
    assert term(v2, "human_rating") == pytest.approx(1.0)  # (5 - 3) / 2
    assert v2.session_version > v1.session_version
    assert store.reward("s1", 2).ruleset_version == engine.ruleset.version


def test_rescore_since_picks_only_sessions_with_newer_feedback(
    engine: RewardEngine, store: SessionStore
) -> None:
    put(store, events([tool("a1")], [feedback(FT.HUMAN_RATING, 3.0, occurred=100.0)], session_id="a"))
    put(store, events([tool("b1")], session_id="b"))
    assert {s.session_id for s in engine.store_all(store, ["a", "b"])} == {"a", "b"}

    late = feedback(FT.AUTO_VALIDATION, 1.0, anchor=Anchor(call_id="b1"), occurred=5000.0, delay=20.0)
    store.append("b", FeedbackAdded(feedback=late, at=late.received_at))
    stored = engine.rescore(store, since=at(4000))
    assert [(s.session_id, s.version, s.new) for s in stored] == [("b", 2, True)]
    v = RewardVector.model_validate(store.reward("b").vector)
    assert term(v, "auto_validation") == pytest.approx(0.3 * 0.8187307531)  # 0.3 · e^(-0.01 · 20)


def test_follow_rescores_from_the_change_feed(engine: RewardEngine, store: SessionStore) -> None:
    put(store, events([tool("a1")], session_id="a"))
    put(store, events([tool("b1")], session_id="b"))
    cursor, stored = engine.follow(store, after=0)
    assert stored == []  # no feedback yet
    store.append("a", FeedbackAdded(feedback=feedback(FT.HUMAN_RATING, 2.0), at=at(200)))
    cursor, stored = engine.follow(store, after=cursor)
    assert [(s.session_id, s.version) for s in stored] == [("a", 1)]
    cursor, stored = engine.follow(store, after=cursor)
    assert stored == []  # the reward itself appears on the feed, but it is not feedback
    _, replayed = engine.follow(store, after=0)  # at-least-once: replaying stores nothing new
    assert [(s.session_id, s.version, s.new) for s in replayed] == [("a", 1, False)]


def test_stats_persist_per_ruleset_version(tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    engine = RewardEngine(RewardConfig(stats_path=path))
    for i in range(3):
        engine.score(build([tool("t1")], [feedback(FT.HUMAN_RATING, 5.0)], session_id=f"s{i}"))
    engine.save_stats()
    doc = json.loads(path.read_text())
    version = engine.ruleset.version
    count, mean, _ = doc[version]["layers"]["experience"]
    assert (count, mean) == (3, pytest.approx(1.0))  # three 5/5 ratings map to 1
    reopened = RewardEngine(RewardConfig(stats_path=path))
    assert reopened.stats.get(version).layers == engine.stats.get(version).layers
    # a 4/5 next is centred on 3 · 1 / (3 + 10) and not scaled (no spread): 0.5 - 3/13 = 0.2692
    vector = reopened.score(build([tool("t1")], [feedback(FT.HUMAN_RATING, 4.0)]))
    assert vector.layers["experience"].normalised == pytest.approx(0.5 - 3 / 13)


def test_a_one_star_rating_costs_and_no_rating_is_neutral(engine: RewardEngine) -> None:
    unrated, panned = (
        build([tool("t1")], session_id="u"),
        build([tool("t1")], [feedback(FT.HUMAN_RATING, 1.0)]),
    )
    assert engine.score(panned, learn=False).session_reward == pytest.approx(-1.0)  # (1 - 3) / 2
    assert engine.score(unrated, learn=False).session_reward == pytest.approx(0.0)
    for i in range(50):  # however many unrated sessions the normaliser saw first
        engine.score(build([tool("t1")], session_id=f"u{i}"))
    assert engine.score(panned, learn=False).session_reward == pytest.approx(-1.0)
    assert engine.score(unrated, learn=False).session_reward == pytest.approx(0.0)


def test_a_rating_is_worth_about_the_same_whenever_the_normaliser_started() -> None:
    """A 4/5 is worth +0.5 to the first session scored; after 200 unrated sessions it used to be worth +5
    (0.5 over a floor scale of 0.1, clipped). Now it is still +0.5, and +0.405 after 200 sessions of which
    20 were rated 5/5 (mean 0.1 shrunk to 200 · 0.1 / 210; their spread, 0.3, is below 1)."""

    def four_after(sessions: list[Session]) -> float:
        engine = RewardEngine(clock=lambda: T0 + timedelta(days=1))
        for seen in sessions:
            engine.score(seen)
        return engine.score(build([tool("t1")], [feedback(FT.HUMAN_RATING, 4.0)])).session_reward

    rated = [feedback(FT.HUMAN_RATING, 5.0)]
    mixed = [build([tool("t1")], rated if i % 10 == 0 else [], session_id=f"m{i}") for i in range(200)]
    assert four_after([]) == pytest.approx(0.5)
    assert four_after([build([tool("t1")], session_id=f"u{i}") for i in range(200)]) == pytest.approx(0.5)
    assert four_after(mixed) == pytest.approx(0.5 - 200 * 0.1 / 210)


def test_learn_false_leaves_the_stats_alone() -> None:
    engine = RewardEngine(RewardConfig(learn=False))
    engine.score(build([tool("t1")], [feedback(FT.HUMAN_RATING, 5.0)]))
    assert engine.stats.get(engine.ruleset.version).layers == {}


def test_best_steps_are_learned_from_solved_sessions(engine: RewardEngine) -> None:
    engine.score(build([tool("t1"), tool("t2", start=2)], session_id="short"))  # solved in 2 calls
    longer = engine.score(build([tool(f"t{i}", start=i) for i in range(4)], session_id="long"))
    assert term(longer, "efficiency") == pytest.approx(2 / 4 - 1)  # best / steps - 1
    unsolved = build([tool("t1", status=CallStatus.ERROR)], answer=False, session_id="x")
    engine.score(unsolved)
    assert engine.stats.get(engine.ruleset.version).best_steps == {"demo": 2}


class Fixed:
    def predict_rating(self, session: Session) -> float:
        return 4.2


def test_a_rating_model_fills_in_unrated_sessions() -> None:
    engine = RewardEngine(rating_model=Fixed())
    assert term(engine.score(build([tool("t1")])), "predicted_rating") == pytest.approx((4.2 - 3) / 2)


def test_contract_sla_budgets_fill_in_where_the_rule_file_has_none() -> None:
    contracts = Path(__file__).resolve().parents[2] / "examples" / "skills"
    engine = RewardEngine(RewardConfig(contracts=contracts))
    calls = [
        tool("t1", "crp_test_request", latency_ms=900.0),  # contract p95 800 ms → breach
        tool("t2", "db_query", latency_ms=3000.0, start=5),  # contract says 2000, the rule file's 5000 wins
        tool("t3", "pdf_text_extract", latency_ms=1500.0, start=10),  # contract 2000 → fine
    ]
    vector = engine.score(build(calls))
    sla = next(t for t in vector.terms if t.name == "sla_breach")
    assert sla.steps == {"t1": -0.2}
    without = RewardEngine().score(build(calls))  # default budget 4000 ms for unlisted tools
    assert next(t for t in without.terms if t.name == "sla_breach").steps == {}


def test_a_rescored_session_is_counted_once_in_the_stats(engine: RewardEngine, store: SessionStore) -> None:
    put(store, events([tool("t1")], [feedback(FT.HUMAN_RATING, 2.0)]))
    engine.score_and_store(store, "s1")
    store.append("s1", FeedbackAdded(feedback=feedback(FT.TASK_OUTCOME, 1.0), at=at(300)))
    assert engine.score_and_store(store, "s1").version == 2
    layers = engine.stats.get(engine.ruleset.version).layers
    assert layers["experience"].count == 1
