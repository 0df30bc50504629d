"""Imports keep what the file says: events in the order of their own times, retries numbered per sub-goal
and tool, latencies from the times given, every rater's rating, a failed tool result as failed (by the
gateway's own rule), and warnings with counts for references to what the file lacks and times it does
not give. A transcript imported and the same conversation captured through the gateway are one session."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import httpx
import orjson
from typer.testing import CliRunner

from sessionrl.capture.importers import read_records
from sessionrl.cli import app
from sessionrl.gateway import ChatReply, ScriptedChat
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.session.model import CallStatus, Session, ToolRequest
from sessionrl.store import SessionStore

SEED = Path(__file__).resolve().parents[2].parent / "shared" / "seed-examples" / "anemia-session.json"
runner = CliRunner()


def import_file(tmp_path: Path, record: Any, name: str = "in.json") -> tuple[str, str]:
    path = tmp_path / name
    path.write_bytes(orjson.dumps(record))
    db = f"sqlite:///{tmp_path / 'sessions.db'}"
    result = runner.invoke(app, ["sessions", "import", str(path), "--db", db], terminal_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split()), db  # the console wraps long lines


def event_kinds(db: str, sid: str) -> list[str]:
    with SessionStore.open(db) as store:
        return [e.event.type for e in store.events(sid)]


def test_the_seed_imports_in_time_order_and_warns_of_the_llm_call_it_lacks(tmp_path: Path) -> None:
    output, db = import_file(tmp_path, orjson.loads(SEED.read_bytes()))
    assert "1 warning(s): 1 dangling reference" in output
    assert "agent_plan.sub_goals.1.llm_call_id" in output
    assert "call_ghi789" in output
    # tc_001 at 08:15:25, the LLM call at 08:15:28, tc_002 at 08:15:32: by time, not by kind
    assert event_kinds(db, "sess_abc123") == [
        "session_created", "plan_set", "tool_call", "llm_call", "tool_call",
        "feedback", "output_set", "state_changed",
    ]  # fmt: skip


def variant() -> dict[str, Any]:
    """The seed with two raters (the second 2.5 h after the session), a timeout and its retry, start and
    end times on calls, and a sub-goal that names no LLM call."""
    seed = copy.deepcopy(orjson.loads(SEED.read_bytes()))
    seed["session_id"] = "sess_variant"
    seed["agent_plan"]["sub_goals"][1].pop("llm_call_id")
    seed["agent_plan"]["sub_goals"].append({"id": "sg3", "description": "写出路径"})
    first, second = seed["tool_calls"]
    first |= {"sub_goal_id": "sg1", "start_timestamp": "2024-03-20T08:15:24.956Z"}
    timed_out = second | {
        "call_id": "tc_002",
        "sub_goal_id": "sg2",
        "status": "timeout",
        "output": None,
        "error_code": "TIMEOUT",
        "start_timestamp": "2024-03-20T08:15:29.000Z",
        "end_timestamp": "2024-03-20T08:15:31.000Z",
    }
    retry = second | {"call_id": "tc_003", "sub_goal_id": "sg2", "latency_ms": 789.0}
    seed["tool_calls"] = [retry, first, timed_out]  # the file's order is not the calls' order
    seed["llm_calls"][0]["start_timestamp"] = "2024-03-20T08:15:26.012Z"
    later = {
        "type": "human_rating", "score": 2, "comment": "应先排除慢性病贫血", "annotator_id": "doc_011",
        "timestamp": "2024-03-20T10:53:15.333Z",
    }  # fmt: skip
    seed["feedback"].append(later)
    return seed


def test_a_design_document_shaped_session_keeps_every_rating_call_time_and_retry(tmp_path: Path) -> None:
    output, db = import_file(tmp_path, variant())
    assert "no warnings" in output
    with SessionStore.open(db) as store:
        session = store.get("sess_variant")
    calls = {c.call_id: c for c in session.tool_calls}
    assert [(c.call_id, c.subgoal_id, c.attempt) for c in session.tool_calls] == [
        ("tc_001", "sg1", 1),
        ("tc_002", "sg2", 1),
        ("tc_003", "sg2", 2),
    ]
    assert calls["tc_002"].status is CallStatus.TIMEOUT
    assert calls["tc_001"].latency_ms == 500.0  # 08:15:24.956 to 08:15:25.456
    assert calls["tc_002"].latency_ms == 2000.0
    assert calls["tc_003"].latency_ms == 789.0  # as given; it started that long before its end
    assert calls["tc_003"].started_at.isoformat() == "2024-03-20T08:15:32+00:00"
    assert session.llm_calls[0].latency_ms == 2000.0
    assert sorted((f.annotator, f.score) for f in session.feedback) == [("doc_007", 4), ("doc_011", 2)]
    assert event_kinds(db, "sess_variant") == [
        "session_created", "plan_set", "tool_call", "llm_call", "tool_call", "tool_call",
        "feedback", "output_set", "state_changed", "feedback",
    ]  # fmt: skip


def test_missing_times_and_dangling_references_are_warned_about_with_counts(tmp_path: Path) -> None:
    seed = orjson.loads(SEED.read_bytes())
    seed["session_id"] = "sess_untimed"
    for record in [*seed["tool_calls"], *seed["llm_calls"], *seed["feedback"]]:
        record.pop("timestamp")
    seed.pop("start_timestamp")
    seed["tool_calls"][0]["sub_goal_id"] = "sg9"
    read = read_records(orjson.dumps(seed))
    assert read.problems == []
    kinds = sorted(w.kind for w in read.warnings)
    # the start, three calls, one rating; the LLM call sg2 names, the sub-goal tc_001 names
    assert kinds == ["dangling_reference"] * 2 + ["missing_time"] * 5
    output, _ = import_file(tmp_path, seed)
    assert "7 warning(s): 2 dangling reference, 5 missing time" in output


TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
CALLS = (
    ToolRequest(id="call_a", name="lookup", arguments='{"id": "O-1"}'),
    ToolRequest(id="call_b", name="lookup", arguments='{"id": "O-9"}'),
)
FAILED = '{"error": {"code": "NOT_FOUND", "message": "no order O-9"}}'
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "Where are orders O-1 and O-9?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in CALLS
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": '{"status": "shipped"}'},
    {"role": "tool", "tool_call_id": "call_b", "content": FAILED},
    {"role": "assistant", "content": "O-1 has shipped; O-9 does not exist."},
]


def comparable(session: Session) -> dict[str, Any]:
    """What a session says, without the ids, times and model names that tell its capture apart."""
    return {
        "query": session.user_query,
        "state": session.state,
        "output": session.final_output,
        "tools": [
            (c.call_id, c.tool, c.params, c.status, c.output, c.error_code, c.error_message)
            for c in session.tool_calls
        ],
        "llm": [(c.messages, c.response, c.tool_calls) for c in session.llm_calls],
    }


async def test_a_transcript_and_the_same_conversation_through_the_gateway_make_the_same_session(
    tmp_path: Path,
) -> None:
    output, db = import_file(tmp_path, {"session_id": "chat-1", "messages": CONVERSATION})
    assert "1 warning(s): 1 missing time" in output  # the transcript gives no time at all
    with SessionStore.open(db) as store:
        imported = store.get("chat-1")
    assert imported.tool_calls[1].status is CallStatus.ERROR
    backend = ScriptedChat.turns([ChatReply(tool_calls=CALLS), ChatReply(text=CONVERSATION[-1]["content"])])
    gateway_db = f"sqlite:///{tmp_path / 'gateway.db'}"
    service = create_app(ServiceConfig(db_url=gateway_db, tokens=parse_tokens("w:read,write")), chat=backend)
    transport = httpx.ASGITransport(app=service)
    async with (
        service.router.lifespan_context(service),
        httpx.AsyncClient(transport=transport, base_url="http://service") as client,
    ):
        for turn in (CONVERSATION[:1], CONVERSATION[:4]):
            answer = await client.post(
                "/gateway/sessions/chat-1/v1/chat/completions",
                json={"model": "m", "messages": turn, "tools": [TOOL]},
                headers={"Authorization": "Bearer w"},
            )
            assert answer.status_code == 200, answer.text
    with SessionStore.open(gateway_db) as store:
        captured = store.get("chat-1")
    assert comparable(captured) == comparable(imported)
