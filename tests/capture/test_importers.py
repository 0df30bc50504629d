"""Importing traces: the seed's worked session as it is, OpenAI transcripts, and every problem at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from typer.testing import CliRunner

from sessionrl.capture.importers import read_records
from sessionrl.cli import app
from sessionrl.session.model import CallStatus, FeedbackType
from sessionrl.store import SessionStore

SEED = Path(__file__).resolve().parents[2].parent / "shared" / "seed-examples" / "anemia-session.json"
runner = CliRunner()

TRANSCRIPT: dict[str, Any] = {
    "session_id": "chat-7",
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "You help with orders."},
        {"role": "user", "content": "Where is order O-1?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"id": "O-1"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": '{"status": "shipped"}'},
        {"role": "assistant", "content": "It has shipped."},
    ],
    "reward": 1.0,
    "feedback": [{"rating": 5, "comment": "quick"}, "no notes"],
}


def import_file(tmp_path: Path, name: str, data: bytes) -> tuple[int, str, str]:
    path = tmp_path / name
    path.write_bytes(data)
    db = f"sqlite:///{tmp_path / 'sessions.db'}"
    result = runner.invoke(app, ["sessions", "import", str(path), "--db", db], terminal_width=200)
    return result.exit_code, result.output, db


def test_the_seed_session_imports_as_it_is(tmp_path: Path) -> None:
    code, output, db = import_file(tmp_path, "anemia-session.json", SEED.read_bytes())
    assert code == 0, output
    with SessionStore.open(db) as store:
        session = store.get("sess_abc123")
    assert session.state.value == "finished"
    assert session.plan is not None
    assert [g.id for g in session.plan.subgoals] == ["sg1", "sg2"]
    assert [c.tool for c in session.tool_calls] == ["lab_result_parser", "guideline_retriever"]
    assert session.tool_calls[0].params == {"report_text": "..."}
    assert session.llm_calls[0].messages[0].content.startswith("你是一名血液科医生")
    (rating,) = session.feedback
    assert (rating.type, rating.score, rating.annotator) == (FeedbackType.HUMAN_RATING, 4, "doc_007")
    assert "慢性病" in (rating.comment or "")
    assert session.metadata["sub_goal_llm_calls"] == {"sg1": "call_def456", "sg2": "call_ghi789"}
    again = import_file(tmp_path, "again.json", SEED.read_bytes())
    assert "imported 0 event(s)" in again[1]  # the same record twice is stored once


def test_an_openai_transcript_becomes_llm_calls_tool_calls_and_feedback(tmp_path: Path) -> None:
    code, output, db = import_file(tmp_path, "chat.jsonl", orjson.dumps(TRANSCRIPT) + b"\n")
    assert code == 0, output
    with SessionStore.open(db) as store:
        session = store.get("chat-7")
    assert session.user_query == "Where is order O-1?"
    first, second = session.llm_calls
    assert first.tool_calls[0].name == "lookup"
    assert [m.role for m in first.messages] == ["system", "user"]
    assert second.response == "It has shipped."
    (call,) = session.tool_calls
    assert (call.call_id, call.params, call.output, call.status) == (
        "call_a",
        {"id": "O-1"},
        {"status": "shipped"},
        CallStatus.SUCCESS,
    )
    assert [(f.type, f.score) for f in session.feedback] == [
        (FeedbackType.TASK_OUTCOME, 1.0),
        (FeedbackType.HUMAN_RATING, 5),
        (FeedbackType.COMMENT, None),
    ]
    assert session.final_output is not None
    assert session.final_output.text == "It has shipped."


def test_every_problem_of_every_record_is_named_by_line_and_field_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    bad_transcript = {
        **TRANSCRIPT,
        "session_id": "chat-8",
        "feedback": [{"rating": 9}],
        "messages": [*TRANSCRIPT["messages"], {"role": "tool", "tool_call_id": "call_zz", "content": "x"}],
    }
    no_version = {"session_id": "s-1", "trace_id": "0" * 32, "user_query": "q"}
    seed = orjson.loads(SEED.read_bytes())
    bad_seed = {**seed, "session_id": "seed-2", "tool_calls": [{**seed["tool_calls"][0], "tool_name": 5}]}
    lines = [orjson.dumps(TRANSCRIPT), b"{oops", orjson.dumps(bad_transcript), orjson.dumps(no_version)]
    code, output, db = import_file(tmp_path, "mixed.jsonl", b"\n".join([*lines, orjson.dumps(bad_seed)]))
    assert code == 1
    assert "4 bad line(s)" in output
    assert "nothing imported" in output
    for expected in (
        "malformed JSON",
        "feedback.0.rating",
        "messages.5.tool_call_id",
        "schema_version",
        "missing:",
        "tool_calls.0.tool_name",
    ):
        assert expected in output, expected
    with SessionStore.open(db) as store:
        assert store.session_ids() == []


def test_records_keep_the_line_they_start_on_and_arrays_name_their_items() -> None:
    read = read_records(b"\n" + orjson.dumps(TRANSCRIPT) + b"\n\n" + b"[1]\n")
    assert [line for line, _ in read.records] == [2]
    assert [(p.line, p.field) for p in read.problems] == [(4, "record")]
    array = read_records(orjson.dumps([TRANSCRIPT, 3], option=orjson.OPT_INDENT_2))
    assert [(p.line, p.field) for p in array.problems] == [(1, "[1].record")]
