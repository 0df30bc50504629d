"""What the session list filters on besides the `sessions` row: a session's facts, its error codes and its
searchable text, each worked out from its current-schema document by the projector.

- `session_facts`: the task verdict (`outcome`: 1 solved, 0 failed, NULL never judged: the latest
  `task_outcome` feedback by the time it happened, as `sessionrl.episodes.verdict.task_success` reads
  it), how many calls failed (tool and LLM calls whose status is not `success`, and LLM calls an
  `auto_validation` verdict of 0 judged, such as a reply the action parser refused), the duration from
  the first step's start to the last step's end, the highest policy version that sampled one of its LLM
  calls, and the `stage` its metadata names (training runs tag demo, rl and eval episodes so).
- `session_errors`: each error code once: tool calls' `error_code`, and the code that leads the comment
  of an `auto_validation` verdict of 0 (`UNPARSEABLE_ACTION: ...`).
- `session_text`: one row of text per session for the full-text index: the query, the final answer, the
  plan's goals, LLM messages and responses, tool outputs and feedback comments, each distinct text once
  (a conversation repeats its earlier messages in every call).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:  # documents imports the backends, whose SQLite one reads this module's DDL
    from sessionrl.store.documents import Doc

FAILED_VERDICT = "auto_validation"
"""Feedback type whose score of 0 marks an LLM call as failed (its comment may lead with an error code)."""

_CODE = re.compile(r"^([A-Z][A-Z0-9_]{2,63}):")

Row = tuple[Any, ...]

SQLITE_DDL = """
CREATE TABLE IF NOT EXISTS session_facts (
    session_id TEXT PRIMARY KEY,
    outcome INTEGER,
    failed_calls INTEGER NOT NULL,
    duration_ms REAL,
    policy_version INTEGER,
    stage TEXT
);
CREATE INDEX IF NOT EXISTS session_facts_outcome ON session_facts (outcome, session_id);
CREATE INDEX IF NOT EXISTS session_facts_stage ON session_facts (stage, session_id);
CREATE TABLE IF NOT EXISTS session_errors (
    session_id TEXT NOT NULL,
    code TEXT NOT NULL,
    PRIMARY KEY (session_id, code)
);
CREATE INDEX IF NOT EXISTS session_errors_code ON session_errors (code, session_id);
CREATE INDEX IF NOT EXISTS rewards_ruleset ON rewards (ruleset_version, session_id);
CREATE TABLE IF NOT EXISTS session_text (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS session_text_session ON session_text (id, session_id);
CREATE VIRTUAL TABLE IF NOT EXISTS session_text_index USING fts5 (
    body, content = 'session_text', content_rowid = 'id', tokenize = 'trigram'
);
CREATE TRIGGER IF NOT EXISTS session_text_insert AFTER INSERT ON session_text BEGIN
    INSERT INTO session_text_index (rowid, body) VALUES (new.id, new.body);
END;
CREATE TRIGGER IF NOT EXISTS session_text_delete AFTER DELETE ON session_text BEGIN
    INSERT INTO session_text_index (session_text_index, rowid, body) VALUES ('delete', old.id, old.body);
END;
CREATE TRIGGER IF NOT EXISTS session_text_update AFTER UPDATE OF id, body ON session_text BEGIN
    INSERT INTO session_text_index (session_text_index, rowid, body) VALUES ('delete', old.id, old.body);
    INSERT INTO session_text_index (rowid, body) VALUES (new.id, new.body);
END;
"""
"""These tables on SQLite (`sessionrl.store.dialect` runs it on every open; PostgreSQL's are in
`sessionrl.store.postgres`), and an index of the rewards by rule-set version (the list's choice of
versions, and its reward filter). `session_text_index` is a trigram FTS5 index over `session_text.body`,
kept in step by triggers as `feedback_text` is over the comments: the list's free-text search
(`SessionQuery.text`)."""


def _time(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def outcome(doc: Doc) -> int | None:
    """1 when the latest task verdict solved the task, 0 when it did not, None without a verdict."""
    verdicts = [f for f in doc["feedback"] if f["type"] == "task_outcome" and f.get("score") is not None]
    if not verdicts:
        return None
    latest = max(verdicts, key=lambda f: _time(f["occurred_at"]))
    return int(float(latest["score"]) > 0)


def judged_failed(doc: Doc) -> dict[str, str]:
    """LLM calls an `auto_validation` verdict of 0 judged, with the error code its comment leads with
    (`REJECTED` when it names none)."""
    out: dict[str, str] = {}
    for f in doc["feedback"]:
        call = (f.get("anchor") or {}).get("call_id")
        score = f.get("score")
        if f["type"] == FAILED_VERDICT and call is not None and score is not None and float(score) <= 0:
            found = _CODE.match(f.get("comment") or "")
            out[call] = found.group(1) if found else "REJECTED"
    return out


def facts_row(doc: Doc) -> Row:
    """The `session_facts` row of a session (see the module doc)."""
    judged = judged_failed(doc)
    calls = [*doc["tool_calls"], *doc["llm_calls"]]
    failed = sum(c.get("status", "success") != "success" or c["call_id"] in judged for c in calls)
    duration = None
    if calls:
        start = min(_time(c["started_at"]) for c in calls)
        end = max(_time(c["finished_at"]) for c in calls)
        duration = max(0.0, (end - start).total_seconds() * 1000)
    versions = [c["policy_version"] for c in doc["llm_calls"] if c.get("policy_version") is not None]
    stage = (doc.get("metadata") or {}).get("stage")
    return (
        doc["session_id"],
        outcome(doc),
        failed,
        duration,
        max(versions) if versions else None,
        None if stage is None else str(stage),
    )


def error_rows(doc: Doc) -> list[Row]:
    """The `session_errors` rows of a session: each error code once."""
    codes = [c["error_code"] for c in doc["tool_calls"] if c.get("error_code")]
    codes += judged_failed(doc).values()
    return [(doc["session_id"], code) for code in dict.fromkeys(codes)]


def text_row(doc: Doc) -> Row:
    """The `session_text` row of a session: its distinct texts, one per line."""
    plan = doc.get("plan") or {}
    texts: list[str] = [doc["user_query"], (doc.get("final_output") or {}).get("text") or ""]
    texts.append(plan.get("root_goal") or "")
    texts += [g.get("description") or "" for g in plan.get("subgoals", ())]
    for call in doc["llm_calls"]:
        texts += [m.get("content") or "" for m in call.get("messages", ())]
        texts.append(call.get("response") or "")
    for call in doc["tool_calls"]:
        output = call.get("output")
        texts.append(output if isinstance(output, str) else _json_text(output))
        texts.append(call.get("error_message") or "")
    texts += [f.get("comment") or "" for f in doc["feedback"]]
    return (doc["session_id"], "\n".join(t for t in dict.fromkeys(texts) if t))


def _json_text(value: Any) -> str:
    """A JSON value as text with non-ASCII kept as it is (so a Chinese tool output is searchable)."""
    return "" if value is None else orjson.dumps(value).decode()
