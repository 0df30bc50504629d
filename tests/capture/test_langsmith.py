"""A LangSmith dump written from the SDK's own models imports as sessions, its feedback as feedback."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
from langsmith.schemas import Feedback, FeedbackSourceBase, Run
from typer.testing import CliRunner

from sessionrl.capture.langsmith import read_langsmith
from sessionrl.capture.trace_records import span_id_of
from sessionrl.cli import app
from sessionrl.session.model import CallStatus, Session
from sessionrl.store import SessionStore

T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
TRACE = uuid.UUID("5b1d2c3e-4f50-6172-8394-a5b6c7d8e9f0")
LLM1, TOOL, LLM2 = (uuid.UUID(int=TRACE.int + i) for i in range(1, 4))
QUESTION = "Where is order 7?"


def run(rid: uuid.UUID, run_type: str, start_s: int, **fields: object) -> bytes:
    parent = None if rid == TRACE else TRACE
    made = Run(
        id=rid,
        trace_id=TRACE,
        parent_run_id=parent,
        run_type=run_type,
        start_time=T0 + timedelta(seconds=start_s),
        end_time=T0 + timedelta(seconds=start_s + 1),
        **fields,
    )
    return made.model_dump_json().encode()


def dump(*, tool_error: str | None = None) -> bytes:
    asked = {
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
    lines = [
        run(
            TRACE,
            "chain",
            0,
            name="agent",
            inputs={"question": QUESTION},
            outputs={"output": "Order 7 ships tomorrow."},
        ),
        run(
            LLM1,
            "llm",
            1,
            name="ChatOpenAI",
            inputs={
                "messages": [
                    [
                        {
                            "lc": 1,
                            "type": "constructor",
                            "id": ["langchain", "schema", "HumanMessage"],
                            "kwargs": {"content": QUESTION},
                        }
                    ]
                ]
            },
            outputs={
                "generations": [
                    [
                        {
                            "text": "",
                            "message": {
                                "type": "ai",
                                "content": "",
                                "tool_calls": [
                                    {"id": "call_1", "name": "order_status", "args": {"order_id": 7}}
                                ],
                            },
                        }
                    ]
                ],
                "llm_output": {"model_name": "gpt-4o-mini"},
            },
            extra={"invocation_params": {"model": "gpt-4o-mini"}},
            prompt_tokens=11,
            completion_tokens=5,
            total_tokens=16,
        ),
        run(
            TOOL,
            "tool",
            3,
            name="order_status",
            inputs={"order_id": 7},
            outputs={"output": {"status": "packed"}},
            error=tool_error,
            extra={"metadata": {"tool_call_id": "call_1"}},
        ),
        run(
            LLM2,
            "llm",
            5,
            name="openai.chat",
            inputs={
                "messages": [
                    {"role": "user", "content": QUESTION},
                    asked,
                    {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "packed"}'},
                ]
            },
            outputs={
                "choices": [{"message": {"role": "assistant", "content": "Order 7 ships tomorrow."}}],
                "usage_metadata": {"input_tokens": 20, "output_tokens": 6, "total_tokens": 26},
            },
        ),
        Feedback(
            id=uuid.uuid5(TRACE, "f1"),
            run_id=LLM2,
            trace_id=TRACE,
            key="correctness",
            score=5,
            comment="right and polite",
            created_at=T0 + timedelta(hours=3),
            modified_at=T0 + timedelta(hours=5),
            feedback_source=FeedbackSourceBase(type="app", user_id=uuid.uuid5(TRACE, "reviewer")),
        )
        .model_dump_json()
        .encode(),
        Feedback(
            id=uuid.uuid5(TRACE, "f2"),
            run_id=TRACE,
            trace_id=TRACE,
            key="conciseness",
            score=0.4,
            created_at=T0 + timedelta(minutes=2),
            modified_at=T0 + timedelta(minutes=2),
            feedback_source=FeedbackSourceBase(type="model"),
        )
        .model_dump_json()
        .encode(),
    ]
    return b"\n".join(lines)


def only_session(data: bytes) -> Session:
    read = read_langsmith(data)
    assert read.problems == []
    assert read.warnings == []
    (record,) = read.records
    return Session.model_validate(orjson.loads(record[1]))


def test_langsmith_runs_import_with_their_calls() -> None:
    s = only_session(dump())
    assert (s.trace_id, s.user_query) == (TRACE.hex, QUESTION)
    assert s.metadata["imported_from"] == "langsmith"
    first, second = s.llm_calls
    assert [(m.role, m.content) for m in first.messages] == [("user", QUESTION)]
    assert [(t.id, t.name, orjson.loads(t.arguments)) for t in first.tool_calls] == [
        ("call_1", "order_status", {"order_id": 7})
    ]
    assert (first.model, first.tokens_used) == ("gpt-4o-mini", 16)
    assert [m.role for m in second.messages] == ["user", "assistant", "tool"]
    assert (second.response, second.tokens_used) == ("Order 7 ships tomorrow.", 26)
    (tool,) = s.tool_calls
    assert (tool.call_id, tool.params, tool.output, tool.status) == (
        "call_1",
        {"order_id": 7},
        {"status": "packed"},
        CallStatus.SUCCESS,
    )
    assert s.final_output is not None
    assert s.final_output.text == "Order 7 ships tomorrow."


def test_feedback_keeps_its_key_source_and_comment() -> None:
    correct, concise = sorted(only_session(dump()).feedback, key=lambda f: f.annotator or "")
    assert (correct.type.value, correct.score, correct.comment) == ("human_rating", 5.0, "right and polite")
    assert correct.annotator == "langsmith:app:correctness"
    assert correct.anchor.call_id == span_id_of(str(LLM2))
    assert correct.received_at - correct.occurred_at == timedelta(hours=2)
    assert (concise.type.value, concise.score, concise.anchor.call_id) == ("auto_validation", 0.4, None)
    assert concise.annotator == "langsmith:model:conciseness"


def test_a_failed_tool_run_is_a_failed_tool_call() -> None:
    (tool,) = only_session(dump(tool_error="TimeoutError: no answer")).tool_calls
    assert (tool.status, tool.error_message) == (CallStatus.ERROR, "TimeoutError: no answer")


def test_feedback_for_a_run_not_in_the_file_is_a_warning() -> None:
    lines = dump().splitlines()
    read = read_langsmith(
        b"\n".join(lines[:4] + lines[5:] + [lines[4].replace(str(LLM2).encode(), str(uuid.uuid4()).encode())])
    )
    assert read.problems == []
    (warning,) = read.warnings
    assert (warning.line, warning.field) == (6, "run_id")


def test_the_cli_imports_a_langsmith_dump_with_its_feedback(tmp_path: Path) -> None:
    dump_file = tmp_path / "langsmith.json"
    dump_file.write_bytes(b"[" + b",".join(dump().splitlines()) + b"]")
    db = f"sqlite:///{tmp_path / 's.db'}"
    result = CliRunner().invoke(
        app, ["sessions", "import", str(dump_file), "--db", db, "--format", "langsmith"]
    )
    assert result.exit_code == 0, result.output
    with SessionStore.open(db) as store:
        stored = store.get(f"otel-{TRACE.hex}")
    assert (len(stored.llm_calls), len(stored.tool_calls), len(stored.feedback)) == (2, 1, 2)
