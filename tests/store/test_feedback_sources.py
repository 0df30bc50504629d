"""Feedback from several sources: the design document's session rated by two annotators 2.5 hours apart
keeps both ratings in the view, the `feedback` table, `sessions show`, the comment search and SQL, on both
backends; a store made before feedback was kept per source (and before `llm_calls.status`) migrates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from store_support import RawDB
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.session import (
    CallStatus,
    Feedback,
    FeedbackAdded,
    LLMCall,
    LLMCallRecorded,
    Session,
    SessionCreate,
)
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.store.documents import SHARDS, write_session
from sessionrl.store.projector import replace_rows

SEED = Path(__file__).resolve().parents[2].parent / "shared" / "seed-examples" / "anemia-session.json"
SECOND = {
    "type": "human_rating",
    "score": 2,
    "comment": "建议补充CRP和ESR检查",  # "add CRP and ESR tests": a word the first rater did not use
    "annotator_id": "doc_012",
    "timestamp": "2024-03-20T10:53:15.333Z",  # 2.5 hours after the first rating
}
runner = CliRunner()


def two_raters() -> dict[str, Any]:
    """The design document's worked session, with a second annotator's rating 2.5 hours after the first."""
    doc = orjson.loads(SEED.read_bytes())
    return {**doc, "feedback": [*doc["feedback"], SECOND]}


@pytest.fixture
def seeded(db_url: str, tmp_path: Path) -> str:
    """The store at `db_url` holding the two-rater session, imported with `sessions import`."""
    path = tmp_path / "two-raters.json"
    path.write_bytes(orjson.dumps(two_raters()))
    result = runner.invoke(app, ["sessions", "import", str(path), "--db", db_url])
    assert result.exit_code == 0, result.output
    return db_url


def test_both_ratings_are_kept_and_shown(seeded: str) -> None:
    with SessionStore.open(seeded) as store:
        session = store.get("sess_abc123")
        rows = store.sql("SELECT annotator, score FROM feedback ORDER BY occurred_at")
    assert [(f.annotator, f.score) for f in session.feedback] == [("doc_007", 4), ("doc_012", 2)]
    assert rows == [{"annotator": "doc_007", "score": 4.0}, {"annotator": "doc_012", "score": 2.0}]
    shown = runner.invoke(app, ["sessions", "show", "sess_abc123", "--db", seeded])
    assert shown.exit_code == 0, shown.output
    assert "feedback (2)" in shown.output
    assert "human_rating 4 by doc_007" in shown.output
    assert "human_rating 2 by doc_012" in shown.output


@pytest.mark.parametrize("needle", ["慢性病", "CRP和ESR"])  # one word of each rater's comment
def test_each_raters_comment_is_searchable(seeded: str, needle: str) -> None:
    with SessionStore.open(seeded) as store:
        assert [r.session_id for r in store.query(SessionQuery(comment_contains=needle))] == ["sess_abc123"]
    args = ["sessions", "query", "--db", seeded, "--json", "--comment-contains", needle]
    found = runner.invoke(app, args)
    assert found.exit_code == 0, found.output
    assert [orjson.loads(line)["session_id"] for line in found.stdout.splitlines()] == ["sess_abc123"]


def test_the_first_raters_comment_is_found_by_its_concept(seeded: str) -> None:
    args = ["sessions", "query", "--db", seeded, "--json", "--comment-mentions", "chronic disease"]
    found = runner.invoke(app, args)
    assert found.exit_code == 0, found.output
    assert [orjson.loads(line)["session_id"] for line in found.stdout.splitlines()] == ["sess_abc123"]


# a store made before feedback was kept per source


def rating(annotator: str, score: float, hour: int) -> FeedbackAdded:
    at = f"2024-03-20T{hour:02d}:00:00Z"
    return FeedbackAdded(
        feedback=Feedback.model_validate(
            {"type": "human_rating", "score": score, "annotator": annotator, "occurred_at": at}
        )
    )


OLD_LLM_CALLS = """CREATE TABLE llm_calls (
    session_id TEXT NOT NULL, call_id TEXT NOT NULL, purpose TEXT NOT NULL, policy_version INTEGER,
    tokens_used INTEGER NOT NULL, n_tokens INTEGER, started_at TEXT NOT NULL, finished_at TEXT NOT NULL,
    PRIMARY KEY (session_id, call_id)
)"""


def make_old(store: SessionStore, raw: RawDB, backend: str) -> None:
    """Turn the store back into what an older version left: the session `two` as the old fold made it
    (only the later of its two ratings), `llm_calls` without `status` and `error`, and the old layout."""
    session = store.get("two")
    old = session.model_copy(update={"feedback": session.feedback[1:]})
    with store.backend.atomic() as conn:
        write_session(conn, old, SHARDS)
        replace_rows(conn, {"two": old.model_dump(mode="json")})
    raw.run("DROP TABLE llm_calls")
    raw.run(OLD_LLM_CALLS)
    raw.run("INSERT INTO llm_calls VALUES ('one', 'l1', 'chat', NULL, 0, NULL, 'x', 'x')")
    if backend == "sqlite":
        raw.run("PRAGMA user_version=3")  # before feedback per source (SQLite layout 4)
    else:
        raw.run("UPDATE store_meta SET value = ? WHERE key = 'layout'", 2)  # before PostgreSQL layout 3


def fill(store: SessionStore) -> Session:
    """Session `one` with a failed LLM call whose server sent no usage; session `two` rated twice."""
    store.create(SessionCreate(user_query="q1", session_id="one"))
    failed = LLMCall(call_id="l1", purpose="chat", status=CallStatus.ERROR, error_message="upstream 500")
    store.append("one", LLMCallRecorded(call=failed))
    store.create(SessionCreate(user_query="q2", session_id="two"))
    store.append("two", rating("doc_007", 4, 8))
    return store.append("two", rating("doc_012", 2, 10))


def test_an_older_store_migrates_on_open(db_url: str, store_backend: str) -> None:
    raw = RawDB(db_url)
    with SessionStore.open(db_url) as store:
        two = fill(store)
        store.project()
        make_old(store, raw, store_backend)
    assert raw.rows("SELECT COUNT(*) FROM feedback") == [(1,)]
    with SessionStore.open(db_url) as store:
        assert store.get("two") == two  # folded again from its log: both ratings
        feedback = store.sql("SELECT annotator, score FROM feedback ORDER BY annotator")
        calls = store.sql("SELECT call_id, status, error, tokens_used FROM llm_calls")
        report = store.consistency_check()
    assert feedback == [{"annotator": "doc_007", "score": 4.0}, {"annotator": "doc_012", "score": 2.0}]
    assert calls == [{"call_id": "l1", "status": "error", "error": "upstream 500", "tokens_used": None}]
    assert report.clean, report.drift
    assert raw.rows("SELECT COUNT(*) FROM cursors WHERE name = 'migration:refold'") == [(0,)]
    with SessionStore.open(db_url) as store:  # once only: opening again finds nothing left to do
        assert store.get("two") == two


def test_failed_calls_and_unknown_usage_are_visible_in_sql_and_show(file_store: SessionStore) -> None:
    fill(file_store)
    ok = LLMCall(call_id="l2", purpose="chat", tokens_used=12, usage={"total_tokens": 12})
    file_store.append("one", LLMCallRecorded(call=ok))
    rows = file_store.sql("SELECT call_id, status, error, tokens_used FROM llm_calls ORDER BY call_id")
    assert rows == [
        {"call_id": "l1", "status": "error", "error": "upstream 500", "tokens_used": None},
        {"call_id": "l2", "status": "success", "error": None, "tokens_used": 12},
    ]
    assert file_store.get("one").llm_calls[0].usage is None
    shown = runner.invoke(app, ["sessions", "show", "one", "--db", file_store.config.url])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.replace("│", " ").split())  # the tree wraps long lines
    assert "✗ error l1 chat · tokens unknown" in text
    assert "upstream 500" in text
    assert "✓ l2 chat · 12 tokens" in text
