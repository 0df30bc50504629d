"""A Langfuse dump written from the SDK's own models imports as sessions, its scores as feedback."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
from langfuse.api import ObservationV2
from langfuse.api.commons.types.score import Score_Categorical, Score_Numeric
from typer.testing import CliRunner

from sessionrl.capture.langfuse import read_langfuse
from sessionrl.cli import app
from sessionrl.session.model import Session
from sessionrl.store import SessionStore

T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
TRACE = "7f3a9c1b2d4e5f60718293a4b5c6d7e8"
ASKED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "order_status", "arguments": '{"order_id": 7}'},
        }
    ],
}


def observation(oid: str, kind: str, start_s: int, end_s: int, **fields: object) -> bytes:
    made = ObservationV2(
        id=oid,
        trace_id=TRACE,
        project_id="shop",
        type=kind,
        start_time=T0 + timedelta(seconds=start_s),
        end_time=T0 + timedelta(seconds=end_s),
        session_id="conversation-9",
        user_id="u-42",
        **fields,
    )
    return made.json().encode()


def dump() -> bytes:
    question = [{"role": "user", "content": "Where is order 7?"}]
    lines = [
        observation(
            "a1a1a1a1a1a1a1a1",
            "AGENT",
            0,
            9,
            name="shop-agent",
            input="Where is order 7?",
            output="Order 7 ships tomorrow.",
        ),
        observation(
            "b2b2b2b2b2b2b2b2",
            "GENERATION",
            1,
            2,
            name="chat",
            parent_observation_id="a1a1a1a1a1a1a1a1",
            model="gpt-4o-mini",
            input=question,
            output=ASKED,
            usage_details={"input": 11, "output": 5, "total": 16},
        ),
        observation(
            "c3c3c3c3c3c3c3c3",
            "TOOL",
            3,
            4,
            name="order_status",
            parent_observation_id="a1a1a1a1a1a1a1a1",
            input={"order_id": 7},
            output={"status": "packed"},
            metadata={"tool_call_id": "call_1"},
        ),
        observation(
            "d4d4d4d4d4d4d4d4",
            "GENERATION",
            5,
            8,
            name="chat",
            parent_observation_id="a1a1a1a1a1a1a1a1",
            model="gpt-4o-mini",
            input=question,
            output={"role": "assistant", "content": "Order 7 ships tomorrow."},
        ),
        Score_Numeric(
            id="s-1",
            trace_id=TRACE,
            observation_id="d4d4d4d4d4d4d4d4",
            name="helpfulness",
            value=4,
            source="ANNOTATION",
            comment="clear answer",
            author_user_id="reviewer-3",
            environment="default",
            timestamp=T0 + timedelta(hours=2),
            created_at=T0 + timedelta(days=1),
            updated_at=T0 + timedelta(days=1),
        )
        .json()
        .encode(),
        Score_Categorical(
            id="s-2",
            trace_id=TRACE,
            name="tone",
            value=1,
            string_value="polite",
            source="EVAL",
            environment="default",
            timestamp=T0 + timedelta(minutes=1),
            created_at=T0 + timedelta(minutes=1),
            updated_at=T0 + timedelta(minutes=1),
        )
        .json()
        .encode(),
    ]
    return b"\n".join(lines) + b"\n"


def only_session(data: bytes) -> Session:
    read = read_langfuse(data)
    assert read.problems == []
    assert read.warnings == []
    (record,) = read.records
    return Session.model_validate(orjson.loads(record[1]))


def test_a_langfuse_trace_imports_with_its_calls() -> None:
    s = only_session(dump())
    assert (s.trace_id, s.user_query, s.user_id) == (TRACE, "Where is order 7?", "u-42")
    assert s.metadata["imported_from"] == "langfuse"
    first, second = s.llm_calls
    assert [t.name for t in first.tool_calls] == ["order_status"]
    assert first.usage == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
    assert first.model == "gpt-4o-mini"
    assert second.response == "Order 7 ships tomorrow."
    (tool,) = s.tool_calls
    assert (tool.call_id, tool.tool, tool.params, tool.output) == (
        "call_1",
        "order_status",
        {"order_id": 7},
        {"status": "packed"},
    )
    assert s.final_output is not None
    assert s.final_output.text == "Order 7 ships tomorrow."


def test_scores_become_feedback_with_their_source_and_comment() -> None:
    rating, tone = sorted(only_session(dump()).feedback, key=lambda f: f.annotator or "")
    assert (rating.type.value, rating.score, rating.comment) == ("human_rating", 4.0, "clear answer")
    assert rating.annotator == "langfuse:annotation:helpfulness"
    assert rating.anchor.call_id == "d4d4d4d4d4d4d4d4"
    assert rating.data["author"] == "reviewer-3"
    assert rating.received_at - rating.occurred_at == timedelta(hours=22)
    assert (tone.type.value, tone.anchor.call_id, tone.data["string_value"]) == (
        "auto_validation",
        None,
        "polite",
    )
    assert tone.annotator == "langfuse:eval:tone"


def test_an_api_page_reads_like_json_lines() -> None:
    page = b'{"data": [' + b",".join(dump().splitlines()) + b'], "meta": {}}'
    assert only_session(page).llm_calls == only_session(dump()).llm_calls


def test_a_bad_record_is_reported_with_its_line_and_field() -> None:
    lines = dump().splitlines()
    broken = orjson.loads(lines[2])
    del broken["startTime"]
    broken["projectId"] = 5
    read = read_langfuse(b"\n".join([*lines[:2], orjson.dumps(broken), *lines[3:]]))
    assert [(p.line, p.field) for p in read.problems] == [(3, "startTime"), (3, "projectId")]


def test_the_cli_imports_a_langfuse_dump_with_its_scores(tmp_path: Path) -> None:
    dump_file = tmp_path / "langfuse.jsonl"
    dump_file.write_bytes(dump())
    db = f"sqlite:///{tmp_path / 's.db'}"
    result = CliRunner().invoke(
        app, ["sessions", "import", str(dump_file), "--db", db, "--format", "langfuse"]
    )
    assert result.exit_code == 0, result.output
    with SessionStore.open(db) as store:
        (sid,) = store.session_ids()
        stored = store.get(sid)
    assert (len(stored.llm_calls), len(stored.tool_calls), len(stored.feedback)) == (2, 1, 2)
    assert {f.annotator for f in stored.feedback} == {"langfuse:annotation:helpfulness", "langfuse:eval:tone"}


def test_a_score_for_an_observation_not_in_the_file_is_a_warning() -> None:
    lines = dump().splitlines()
    stray = orjson.loads(lines[4])
    stray["observationId"] = "e5e5e5e5e5e5e5e5"
    read = read_langfuse(b"\n".join([*lines[:4], orjson.dumps(stray), lines[5]]))
    assert read.problems == []
    (warning,) = read.warnings
    assert (warning.line, warning.field, warning.kind) == (5, "observationId", "dangling_reference")
    (record,) = read.records
    assert [f["annotator"] for f in orjson.loads(record[1])["feedback"]] == ["langfuse:eval:tone"]
