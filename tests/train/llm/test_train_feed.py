"""The feed readers: the shaper scores finished, judged sessions once; the trainer keeps fresh ones."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sessionrl.rewards.engine import RewardEngine
from sessionrl.session.events import FeedbackAdded, LLMCallRecorded, StateChanged
from sessionrl.session.model import Feedback, FeedbackType, LLMCall, SessionCreate, SessionState
from sessionrl.store import SessionStore
from sessionrl.train.llm.feed import RewardShaper, Scored, read_scored


@pytest.fixture
def store() -> Iterator[SessionStore]:
    with SessionStore.open("sqlite://") as opened:
        yield opened


def episode(
    store: SessionStore,
    sid: str,
    *,
    version: int,
    stage: str = "rl",
    judged: bool = True,
    solved: bool = True,
) -> None:
    """A finished session of one policy call sampled by `version`, judged (`solved` or not) when `judged`."""
    store.create(SessionCreate(user_query="q", session_id=sid, metadata={"stage": stage, "group": "g"}))
    store.append(
        sid, LLMCallRecorded(call=LLMCall(call_id=f"l_{sid}", token_ids=(1,), policy_version=version))
    )
    store.append(sid, StateChanged(state=SessionState.FINISHED))
    if judged:
        outcome = Feedback(type=FeedbackType.TASK_OUTCOME, score=float(solved))
        store.append(sid, FeedbackAdded(feedback=outcome))


def test_the_shaper_scores_finished_judged_sessions_once(store: SessionStore) -> None:
    episode(store, "a", version=0)
    episode(store, "b", version=0, judged=False)
    shaper = RewardShaper(RewardEngine(), store)
    cursor, scored = shaper.follow(0)
    assert scored == 1
    assert [r.version for r in store.rewards("a")] == [1]
    assert store.rewards("b") == []
    # only the reward itself is new on the feed: nothing is scored again; a re-read from 0 keeps the version
    later, again = shaper.follow(cursor)
    assert (again, later) == (0, cursor + 1)
    shaper.follow(0)
    assert [r.version for r in store.rewards("a")] == [1]


def rewards_committed_in(order: str) -> dict[str, float]:
    """The long-term rewards of episodes "a" (solved), "b" and "c" (not), written in `order`."""
    with SessionStore.open("sqlite://") as store:
        for sid in order:
            episode(store, sid, version=0, solved=sid == "a")
        RewardShaper(RewardEngine(), store).follow(0)
        read = read_scored(store, 0, stage="rl", version=0, max_lag=0)
        return {s.session.session_id: s.reward("long_term") for s in read.fresh}


def test_the_shaper_scores_in_the_order_of_ids_not_of_commits() -> None:
    # each score reads the layer statistics the earlier ones left: concurrent episodes commit in the
    # order the machine's timing gives, so scoring in that order made seeded runs differ
    rewards = rewards_committed_in("abc")
    assert rewards_committed_in("cba") == rewards_committed_in("bca") == rewards
    assert rewards["a"] > rewards["c"] > rewards["b"]  # b and c alike, normalised by different statistics


def test_the_trainer_keeps_fresh_sessions_of_its_stage_and_counts_stale_ones(store: SessionStore) -> None:
    for sid, version in (("new", 5), ("lag2", 3), ("lag3", 2)):
        episode(store, sid, version=version)
    episode(store, "eval", version=5, stage="eval")
    RewardShaper(RewardEngine(), store).follow(0)
    read = read_scored(store, 0, stage="rl", version=5, max_lag=2)
    assert sorted(s.session.session_id for s in read.fresh) == ["lag2", "new"]
    assert read.stale == 1
    # the cursor moves past what was read: the next read finds nothing new
    again = read_scored(store, read.cursor, stage="rl", version=5, max_lag=2)
    assert (again.fresh, again.stale, again.cursor) == ((), 0, read.cursor)


def test_scored_reads_session_layer_and_term_rewards(store: SessionStore) -> None:
    episode(store, "a", version=0)
    RewardShaper(RewardEngine(), store).follow(0)
    (scored,) = read_scored(store, 0, stage="rl", version=0, max_lag=0).fresh
    assert isinstance(scored, Scored)
    # task outcome 1.0 -> the `task_outcome` rule gives 2*1 - 1 = +1 in the long-term layer (arrived at once)
    assert scored.reward("term:task_outcome") == pytest.approx(1.0)
    assert scored.reward("layer:long_term") == pytest.approx(1.0)
    assert scored.reward("long_term") == pytest.approx(scored.vector["long_term_reward"])
    assert scored.reward("term:never_fired") == 0.0
