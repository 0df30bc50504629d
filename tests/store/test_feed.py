"""The change feed (cursor-based, at-least-once) and versioned reward vectors."""

from __future__ import annotations

import pytest

from sessionrl.errors import InvalidEvent, NotFound
from sessionrl.session import Feedback, FeedbackAdded, FeedbackType, SessionCreate, SessionState, StateChanged
from sessionrl.store import SessionStore


def test_the_feed_lists_every_change_in_commit_order(running: SessionStore) -> None:
    batch = running.changes()
    assert [(c.session_id, c.seq, c.type) for c in batch.changes] == [
        ("s1", 1, "session_created"),
        ("s1", 2, "plan_set"),
        ("s1", 3, "state_changed"),
        ("s1", 4, "tool_call"),
    ]
    assert [c.cursor for c in batch.changes] == sorted(c.cursor for c in batch.changes)
    assert batch.cursor == batch.changes[-1].cursor
    assert batch.changes[0].at == running.get("s1").created_at


def test_cursors_page_through_the_feed_without_gaps_or_repeats(running: SessionStore) -> None:
    running.create(SessionCreate(user_query="q", session_id="s2"))
    seen: list[tuple[str, int]] = []
    cursor = 0
    while True:
        batch = running.changes(after=cursor, limit=2)
        if not batch.changes:
            break
        assert len(batch.changes) <= 2
        seen += [(c.session_id, c.seq) for c in batch.changes]
        cursor = batch.cursor
    assert seen == [("s1", 1), ("s1", 2), ("s1", 3), ("s1", 4), ("s2", 1)]
    assert running.changes(after=cursor) == running.changes(after=cursor)  # empty, cursor unchanged
    assert running.changes(after=cursor).cursor == cursor


def test_a_reader_that_did_not_save_its_cursor_sees_the_same_changes_again(running: SessionStore) -> None:
    first = running.changes(after=1, limit=2)
    running.append("s1", StateChanged(state=SessionState.FINISHED))
    assert running.changes(after=1, limit=2) == first
    assert [c.type for c in running.changes(after=first.cursor).changes] == ["tool_call", "state_changed"]


def test_saved_rewards_appear_on_the_feed_with_their_version(running: SessionStore) -> None:
    start = running.changes().cursor
    running.save_reward("s1", {"session": 0.5}, "rules-1")
    running.save_reward("s1", {"session": 0.7}, "rules-1")
    assert [(c.type, c.seq) for c in running.changes(after=start).changes] == [("reward", 1), ("reward", 2)]


@pytest.mark.parametrize(
    ("after", "limit", "field"), [(-1, 10, "after"), (0, 0, "limit"), (0, 10_001, "limit")]
)
def test_bad_feed_arguments_are_rejected(running: SessionStore, after: int, limit: int, field: str) -> None:
    with pytest.raises(InvalidEvent) as err:
        running.changes(after=after, limit=limit)
    assert err.value.field == field


# rewards


def test_reward_versions_count_up_and_old_ones_stay(running: SessionStore) -> None:
    assert running.save_reward("s1", {"session": 0.5, "steps": {"c1": 0.5}}, "rules-1") == 1
    late = Feedback(type=FeedbackType.HUMAN_RATING, score=1)
    running.append("s1", FeedbackAdded(feedback=late))
    assert running.save_reward("s1", {"session": -0.25}, "rules-2") == 2
    first, second = running.rewards("s1")
    assert (first.version, first.ruleset_version, first.vector) == (
        1,
        "rules-1",
        {"session": 0.5, "steps": {"c1": 0.5}},
    )
    assert (second.version, second.ruleset_version, second.vector) == (2, "rules-2", {"session": -0.25})
    # rewarded at state_version 4, re-scored after the feedback event made it 5
    assert (first.session_version, second.session_version) == (4, 5)
    assert running.reward("s1") == second
    assert running.reward("s1", version=1) == first


def test_rewards_of_unknown_sessions_or_versions_are_not_found(running: SessionStore) -> None:
    with pytest.raises(NotFound):
        running.save_reward("ghost", {"session": 1.0}, "rules-1")
    with pytest.raises(NotFound):
        running.rewards("ghost")
    with pytest.raises(NotFound):
        running.reward("s1")
    running.save_reward("s1", {"session": 1.0}, "rules-1")
    with pytest.raises(NotFound):
        running.reward("s1", version=2)


def test_a_vector_that_is_not_json_is_rejected(running: SessionStore) -> None:
    with pytest.raises(InvalidEvent) as err:
        running.save_reward("s1", {"session": object()}, "rules-1")
    assert err.value.field == "vector"
    assert running.rewards("s1") == []
