"""The session list's tables (`sessionrl.store.summary`) on both backends: what the projector writes, the
filters that read them (free text through the text index, with the glossary), and a store of the layout
before them, filled once when it is next opened."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from store_support import RawDB

from sessionrl.session import FeedbackAdded, LLMCallRecorded, StateChanged, ToolCallRecorded
from sessionrl.session.model import (
    Anchor,
    CallStatus,
    Feedback,
    FeedbackType,
    LLMCall,
    Message,
    SessionCreate,
    SessionState,
    ToolCall,
)
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.store.query import search_terms

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def fill(store: SessionStore) -> None:
    """`cn`: a Chinese session whose task failed after a tool error; `en`: an English one, solved, with a
    reply the action parser refused."""
    store.create(
        SessionCreate(session_id="cn", user_query="请生成贫血鉴别诊断路径", metadata={"stage": "eval"})
    )
    tool = ToolCall(
        call_id="t1", tool="lab", status=CallStatus.ERROR, error_code="UNAVAILABLE", latency_ms=40,
        started_at=T0, finished_at=T0 + timedelta(milliseconds=40),
    )  # fmt: skip
    for event in (
        StateChanged(state=SessionState.EXECUTING),
        ToolCallRecorded(call=tool),
        FeedbackAdded(feedback=Feedback(type=FeedbackType.COMMENT, comment="未提及需排除慢性病贫血")),
        FeedbackAdded(feedback=Feedback(type=FeedbackType.TASK_OUTCOME, score=1.0, occurred_at=T0)),
        FeedbackAdded(
            feedback=Feedback(type=FeedbackType.TASK_OUTCOME, score=0.0, occurred_at=T0 + timedelta(1))
        ),
        StateChanged(state=SessionState.FINISHED),
    ):
        store.append("cn", event)
    store.create(SessionCreate(session_id="en", user_query="where is my parcel"))
    llm = LLMCall(
        call_id="l1", messages=(Message(role="user", content="the ferritin level"),), response="{oops",
        policy_version=7, started_at=T0, finished_at=T0 + timedelta(milliseconds=250),
    )  # fmt: skip
    charge = Feedback(
        type=FeedbackType.AUTO_VALIDATION, score=0.0, comment="UNPARSEABLE_ACTION: not an action",
        anchor=Anchor(call_id="l1"),
    )  # fmt: skip
    for later in (
        StateChanged(state=SessionState.EXECUTING),
        LLMCallRecorded(call=llm),
        FeedbackAdded(feedback=charge),
        FeedbackAdded(feedback=Feedback(type=FeedbackType.TASK_OUTCOME, score=1.0)),
    ):
        store.append("en", later)


def ids(store: SessionStore, **filters: object) -> list[str]:
    return [
        r.session_id for r in store.query(SessionQuery.model_validate({"order_by": "session_id", **filters}))
    ]


def test_the_projector_writes_each_sessions_facts_errors_and_text(db_url: str) -> None:
    with SessionStore.open(db_url) as store:
        fill(store)
        facts = store.sql("SELECT * FROM session_facts ORDER BY session_id")
        errors = store.sql("SELECT session_id, code FROM session_errors ORDER BY session_id")
    assert facts == [
        # the later verdict (by when it happened) says failed; one failed call of 40 ms
        {"session_id": "cn", "outcome": 0, "failed_calls": 1, "duration_ms": 40.0, "policy_version": None,
         "stage": "eval"},
        {"session_id": "en", "outcome": 1, "failed_calls": 1, "duration_ms": 250.0, "policy_version": 7,
         "stage": None},
    ]  # fmt: skip
    assert errors == [
        {"session_id": "cn", "code": "UNAVAILABLE"},
        {"session_id": "en", "code": "UNPARSEABLE_ACTION"},
    ]


def test_the_list_filters_and_free_text_with_the_glossary(db_url: str) -> None:
    with SessionStore.open(db_url) as store:
        fill(store)
        assert ids(store, outcome="failed") == ["cn"]
        assert ids(store, outcome="solved") == ["en"]
        assert ids(store, error_code="UNPARSEABLE_ACTION") == ["en"]
        assert ids(store, failed_calls=True) == ["cn", "en"]
        assert ids(store, stage="eval") == ["cn"]
        assert ids(store, policy_version=7, min_duration_ms=200) == ["en"]
        assert ids(store, text="chronic disease") == ["cn"]  # 慢性病, in a comment
        assert ids(store, text="Anemia") == ["cn"]  # 贫血: shorter than a trigram, scanned
        assert ids(store, text="FERRITIN") == ["en"]  # an LLM message, case ignored
        assert ids(store, text="parcel ferritin") == ["en"]
        assert ids(store, text="parcel anemia") == []
        assert store.count(SessionQuery(text="chronic disease", outcome="failed")) == 1


def test_search_terms_split_words_unless_the_text_is_a_glossary_term() -> None:
    assert search_terms("late delivery") == [("late delivery", "延迟", "迟到")]
    assert search_terms("refund late") == [("refund", "退款"), ("late",)]


def test_a_store_of_the_layout_before_gets_its_list_tables_filled_once(
    db_url: str, store_backend: str
) -> None:
    with SessionStore.open(db_url) as store:
        fill(store)
        store.project()
    raw = RawDB(db_url)
    for table in ("session_text_index", "session_text", "session_errors", "session_facts"):
        if table != "session_text_index" or store_backend == "sqlite":
            raw.run(f"DROP TABLE {table}")
    if store_backend == "sqlite":
        raw.run("PRAGMA user_version=4")
    else:
        raw.run("UPDATE store_meta SET value = 3 WHERE key = 'layout'")
    with SessionStore.open(db_url) as store:
        assert ids(store, text="chronic disease") == ["cn"]
        assert ids(store, outcome="solved") == ["en"]
        assert store.consistency_check().clean
    assert raw.rows("SELECT COUNT(*) FROM cursors WHERE name LIKE 'migration:%'") == [(0,)]


@pytest.mark.parametrize("store_backend", ["sqlite"])
def test_a_drifted_session_text_index_is_named_and_rebuilt(db_url: str) -> None:
    with SessionStore.open(db_url) as store:
        fill(store)
        store.project()
    raw = RawDB(db_url)
    raw.run("DROP TRIGGER session_text_update")  # a hand edit the index does not follow
    raw.run("UPDATE session_text SET body = 'nothing here' WHERE session_id = 'cn'")
    with SessionStore.open(db_url) as store:
        problem = store.backend.text_index_problem()
        assert problem is not None
        assert problem.startswith("session_text_index")
        store.backend.rebuild_text_index()
        assert store.backend.text_index_problem() is None
        assert ids(store, text="chronic disease") == []  # the index now reads the edited text


@pytest.mark.parametrize("store_backend", ["postgresql"])
def test_a_missing_session_text_index_is_named_and_made_again_on_postgresql(db_url: str) -> None:
    with SessionStore.open(db_url) as store:
        fill(store)
        RawDB(db_url).run("DROP INDEX session_text_trgm")
        assert store.backend.text_index_problem() == "index session_text_trgm is missing"
        store.backend.rebuild_text_index()
        assert store.backend.text_index_problem() is None
        assert ids(store, text="chronic disease") == ["cn"]
