"""The write and read path: round trips, idempotency, concurrency errors, bad input, schema versions."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from store_support import RawDB

from sessionrl.errors import EventTooLarge, InvalidEvent, InvalidTransition, NotFound, StaleState
from sessionrl.session import (
    Anchor,
    CallStatus,
    Feedback,
    FeedbackAdded,
    FeedbackType,
    OutputSet,
    SessionCreate,
    SessionState,
    StateChanged,
    SubGoal,
    ToolCall,
    ToolCallRecorded,
    created,
    fold,
)
from sessionrl.session.codec import digest
from sessionrl.session.model import FinalOutput
from sessionrl.store import SessionStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def counts(store: SessionStore) -> dict[str, Any]:
    """Rows in every table an append writes."""
    found = store.sql(
        "SELECT (SELECT COUNT(*) FROM events) AS events, (SELECT COUNT(*) FROM outbox) AS outbox,"
        " (SELECT COUNT(*) FROM session_head) AS heads"
    )[0]
    for name, table in (("shards", "session_shard"), ("head_docs", "session_head")):
        found[name] = [r["doc"] for r in store.sql(f"SELECT doc FROM {table} ORDER BY session_id")]
    return found


def tool_call(call_id: str, status: CallStatus = CallStatus.SUCCESS, **extra: Any) -> ToolCallRecorded:
    return ToolCallRecorded(call=ToolCall(call_id=call_id, tool="crp_test_request", status=status, **extra))


def rating(score: float, occurred: datetime, **extra: Any) -> FeedbackAdded:
    return FeedbackAdded(
        feedback=Feedback(type=FeedbackType.HUMAN_RATING, score=score, occurred_at=occurred, **extra)
    )


# round trips


def test_create_returns_the_session_and_get_reads_it_back(store: SessionStore) -> None:
    made = store.create(SessionCreate(user_query="fever 38.6", scenario="clinic", tags=("a", "b")))
    assert made.state_version == 1
    assert store.get(made.session_id) == made
    assert (made.scenario, made.tags, made.user_query) == ("clinic", ("a", "b"), "fever 38.6")


def test_a_fresh_connection_reads_what_the_fold_of_the_log_gives(
    file_running: SessionStore, db_url: str
) -> None:
    file_running.append("s1", rating(4, T0))
    in_process = file_running.get("s1")
    with SessionStore.open(db_url) as other:
        stored = other.get("s1")
        log = other.events("s1")
    assert stored == in_process == fold(e.event for e in log)
    # created (1) + plan (2) + executing (3) + tool call (4) + feedback (5)
    assert stored.state_version == 5
    assert (stored.versions.plan, stored.versions.execution, stored.versions.feedback) == (1, 2, 1)
    assert [e.seq for e in log] == [1, 2, 3, 4, 5]
    assert [e.type for e in log] == ["session_created", "plan_set", "state_changed", "tool_call", "feedback"]


def test_an_event_rewrites_only_its_own_shard(file_running: SessionStore, raw: RawDB) -> None:
    raw.run("UPDATE session_shard SET doc = replace(doc, 'triage', 'MARK') WHERE shard = 'plan'")
    file_running.append("s1", tool_call("c2"))
    docs = dict(raw.rows("SELECT shard, doc FROM session_shard WHERE session_id = 's1'"))
    assert "MARK" in docs["plan"]  # not rewritten by a tool call
    assert '"c2"' in docs["execution"]


def test_session_ids_and_iteration_cover_every_session(running: SessionStore) -> None:
    running.create(SessionCreate(user_query="q", session_id="s0"))
    assert running.session_ids() == ["s0", "s1"]
    assert running.session_ids(SessionState.EXECUTING) == ["s1"]
    assert [s.session_id for s in running.iter_sessions(batch=1)] == ["s0", "s1"]
    assert list(running.iter_sessions(SessionState.EXECUTING)) == [running.get("s1")]


def test_unknown_sessions_are_not_found(store: SessionStore) -> None:
    with pytest.raises(NotFound):
        store.get("nope")
    with pytest.raises(NotFound):
        store.events("nope")
    with pytest.raises(NotFound):
        store.append("nope", StateChanged(state=SessionState.EXECUTING))


# idempotency


def test_the_same_event_twice_is_stored_once(running: SessionStore) -> None:
    event = tool_call("c2")
    first = running.append("s1", event)
    before = counts(running)
    again = running.append("s1", event)
    assert again == first
    assert again.state_version == 5
    assert counts(running) == before


def test_a_retried_event_wins_over_its_stale_expected_version(running: SessionStore) -> None:
    event = tool_call("c2")
    running.append("s1", event, expected_version=4)
    assert running.append("s1", event, expected_version=4).state_version == 5


def test_create_is_idempotent_by_event_id_even_with_a_generated_session_id(store: SessionStore) -> None:
    first = store.create(SessionCreate(user_query="q"), event_id="req-42")
    again = store.create(SessionCreate(user_query="q"), event_id="req-42")
    assert again.session_id == first.session_id
    assert store.session_ids() == [first.session_id]


def test_an_event_id_cannot_be_reused_by_another_session(running: SessionStore) -> None:
    running.create(SessionCreate(user_query="q", session_id="s2"))
    event = tool_call("c9")
    running.append("s1", event)
    running.append("s2", StateChanged(state=SessionState.EXECUTING))
    with pytest.raises(InvalidEvent) as err:
        running.append("s2", event)
    assert err.value.field == "event_id"
    assert "'s1'" in err.value.rule


def test_a_duplicate_inside_one_batch_is_stored_once(running: SessionStore) -> None:
    event = tool_call("c2")
    results = running.append_batch([("s1", event, None), ("s1", event, None)])
    assert [r.state_version for r in results if not isinstance(r, Exception)] == [5, 5]
    assert len(running.events("s1")) == 5


# optimistic concurrency


def test_expected_version_behind_or_ahead_raises_stale_state_naming_both(running: SessionStore) -> None:
    for expected in (3, 5):
        with pytest.raises(StaleState) as err:
            running.append("s1", tool_call(f"x{expected}"), expected_version=expected)
        assert (err.value.expected, err.value.actual) == (expected, 4)
        assert str(expected) in str(err.value)
        assert "4" in str(err.value)
    assert running.append("s1", tool_call("c2"), expected_version=4).state_version == 5


def test_min_version_above_the_stored_one_raises_stale_state(running: SessionStore) -> None:
    assert running.get("s1", min_version=4).state_version == 4
    with pytest.raises(StaleState) as err:
        running.get("s1", min_version=5)
    assert (err.value.expected, err.value.actual) == (5, 4)


def test_a_second_writer_on_the_same_file_is_seen_not_overwritten(
    file_running: SessionStore, db_url: str
) -> None:
    file_running.get("s1")  # cached at version 4
    with SessionStore.open(db_url) as other:
        other.append("s1", tool_call("c2"))
    after = file_running.append("s1", tool_call("c3"))
    assert after.state_version == 6
    assert [c.call_id for c in after.tool_calls] == ["c1", "c2", "c3"]
    assert [e.seq for e in file_running.events("s1")] == [1, 2, 3, 4, 5, 6]


def test_concurrent_writers_on_threads_lose_nothing(file_store: SessionStore) -> None:
    sids = [f"t{i}" for i in range(4)]
    for sid in sids:
        file_store.create(SessionCreate(user_query="q", session_id=sid))
        file_store.append(sid, StateChanged(state=SessionState.EXECUTING))

    def work(sid: str) -> None:
        for n in range(25):
            file_store.append(sid, tool_call(f"{sid}.c{n}"))

    threads = [threading.Thread(target=work, args=(sid,)) for sid in sids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for sid in sids:
        # created (1) + executing (2) + 25 calls
        assert file_store.get(sid).state_version == 27
        assert len(file_store.get(sid).tool_calls) == 25


# lifecycle


def test_disallowed_transitions_raise_and_write_nothing(running: SessionStore) -> None:
    running.append("s1", StateChanged(state=SessionState.FINISHED))
    before = counts(running)
    with pytest.raises(InvalidTransition):
        running.append("s1", StateChanged(state=SessionState.EXECUTING))
    with pytest.raises(InvalidTransition):
        running.append("s1", tool_call("late"))
    assert counts(running) == before


def test_feedback_is_accepted_after_archiving(running: SessionStore) -> None:
    running.append("s1", StateChanged(state=SessionState.FINISHED))
    running.append("s1", StateChanged(state=SessionState.ARCHIVED))
    assert len(running.append("s1", rating(5, T0)).feedback) == 1


# bad input


@pytest.mark.parametrize(
    ("raw", "field", "rule"),
    [
        (b'{"type": "tool_call", "call": ', "body", "malformed JSON"),
        (
            {"type": "tool_call", "call": {"call_id": "c", "tool": "t", "status": "success"}, "bogus": 1},
            "tool_call.bogus",
            "extra_forbidden",
        ),
        (
            {"type": "feedback", "feedback": {"type": "human_rating", "score": "high"}},
            "feedback.feedback.score",
            "float",
        ),
        ('{"type": "state_changed", "state": "flying"}', "state_changed.state", "enum"),
    ],
)
def test_bad_input_names_field_and_rule_and_writes_nothing(
    running: SessionStore, raw: Any, field: str, rule: str
) -> None:
    before = counts(running)
    with pytest.raises(InvalidEvent) as err:
        running.append("s1", raw)
    assert err.value.field == field
    assert rule in err.value.rule
    assert counts(running) == before


def test_raw_json_that_is_valid_is_appended(running: SessionStore) -> None:
    raw = b'{"type": "output_set", "event_id": "o1", "output": {"text": "see a GP"}}'
    assert running.append("s1", raw).final_output == FinalOutput(text="see a GP")


def test_an_oversize_event_raises_and_writes_nothing(db_url: str) -> None:
    with SessionStore.open(db_url, max_event_bytes=2048) as store:
        store.create(SessionCreate(user_query="q", session_id="s1"))
        store.append("s1", StateChanged(state=SessionState.EXECUTING))
        before = counts(store)
        with pytest.raises(EventTooLarge) as err:
            store.append("s1", tool_call("big", output="x" * 4096))
        assert err.value.limit == 2048
        assert err.value.size > 4096
        assert err.value.field == "event"
        assert "2048" in err.value.rule
        assert counts(store) == before
        store.append("s1", tool_call("small", output="x" * 100))


def test_a_creation_event_for_another_session_is_refused(store: SessionStore) -> None:
    event = created(SessionCreate(user_query="q", session_id="a"))
    with pytest.raises(InvalidEvent) as err:
        store.append("b", event)
    assert err.value.field == "session_id"
    assert store.session_ids() == []


def test_a_batch_reports_each_rejection_and_keeps_the_rest(running: SessionStore) -> None:
    results = running.append_batch(
        [
            ("s1", tool_call("c2"), None),
            ("s1", b"{oops", None),
            ("s1", tool_call("c3"), 1),
            ("nope", tool_call("c4"), None),
            ("s1", tool_call("c5"), 5),
        ]
    )
    kinds = [type(r).__name__ for r in results]
    assert kinds == ["Session", "InvalidEvent", "StaleState", "NotFound", "Session"]
    assert [c.call_id for c in running.get("s1").tool_calls] == ["c1", "c2", "c5"]


def test_one_batch_creates_writes_and_rejects_like_single_appends(store: SessionStore) -> None:
    shared = tool_call("c1")
    results = store.append_batch(
        [
            ("a", created(SessionCreate(user_query="q", session_id="a")), None),
            ("a", StateChanged(state=SessionState.EXECUTING), 1),
            ("a", shared, None),
            ("b", created(SessionCreate(user_query="q", session_id="b")), None),
            ("b", StateChanged(state=SessionState.EXECUTING), None),
            ("b", shared, None),  # an event id session a used earlier in this batch
            ("b", tool_call("c2"), 3),  # b is at version 2: stale
            ("a", tool_call("c3"), 3),
        ]
    )
    kinds = [type(r).__name__ for r in results]
    assert kinds == [
        "Session",
        "Session",
        "Session",
        "Session",
        "Session",
        "InvalidEvent",
        "StaleState",
        "Session",
    ]
    # a: created, executing, c1, c3 = 4 events; b: created, executing = 2 events; one outbox row per event
    assert {k: v for k, v in counts(store).items() if k in ("events", "outbox", "heads")} == {
        "events": 6,
        "outbox": 6,
        "heads": 2,
    }
    for sid in ("a", "b"):
        assert store.get(sid) == fold(e.event for e in store.events(sid))
    assert [c.call_id for c in store.get("a").tool_calls] == ["c1", "c3"]


# feedback anchors and last-writer-wins


def test_feedback_anchored_to_an_unknown_call_or_subgoal_is_rejected(running: SessionStore) -> None:
    before = counts(running)
    for anchor, field in ((Anchor(call_id="ghost"), "call_id"), (Anchor(subgoal_id="g9"), "subgoal_id")):
        with pytest.raises(InvalidEvent) as err:
            running.append("s1", rating(2, T0, anchor=anchor))
        assert err.value.field == f"feedback.anchor.{field}"
    assert counts(running) == before
    assert running.append("s1", rating(2, T0, anchor=Anchor(call_id="c1"))).feedback[0].anchor.call_id == "c1"


def test_late_arriving_older_feedback_does_not_overwrite_newer(running: SessionStore) -> None:
    running.append("s1", rating(5, T0 + timedelta(hours=2)))
    after = running.append("s1", rating(1, T0))  # happened earlier, arrived later
    assert [f.score for f in after.feedback] == [5]
    assert after.versions.feedback == 2  # both events are logged
    assert after == fold(e.event for e in running.events("s1"))
    assert [f.score for f in running.append("s1", rating(3, T0 + timedelta(hours=3))).feedback] == [3]


# schema versions


def test_a_v1_document_reads_back_as_v2(
    file_store: SessionStore, raw: RawDB, write_v1: Callable[[RawDB, str, str, list[str]], None]
) -> None:
    write_v1(raw, "old", "triage", ["parse labs", "retrieve guideline"])
    session = file_store.get("old")
    assert session.schema_version == 2
    assert session.plan is not None
    assert session.plan.root_goal == "triage"
    assert session.plan.subgoals == (
        SubGoal(id="g1", description="parse labs"),
        SubGoal(id="g2", description="retrieve guideline"),
    )
    log = file_store.events("old")
    assert [e.schema_version for e in log] == [1, 1]
    assert fold(e.event for e in log) == session
    assert file_store.consistency_check().clean


def test_appending_to_a_v1_session_rewrites_it_as_v2(
    file_store: SessionStore, raw: RawDB, write_v1: Callable[[RawDB, str, str, list[str]], None]
) -> None:
    write_v1(raw, "old", "triage", ["parse labs"])
    file_store.append("old", OutputSet(output=FinalOutput(text="done")))
    [version] = raw.rows("SELECT schema_version FROM session_head WHERE session_id = 'old'")
    [plan] = raw.rows("SELECT doc FROM session_shard WHERE session_id = 'old' AND shard = 'plan'")
    assert version == (2,)
    assert '"id":"g1"' in plan[0]
    with SessionStore.open(raw.url) as other:
        assert digest(other.get("old")) == digest(file_store.get("old"))
    assert file_store.consistency_check().clean
