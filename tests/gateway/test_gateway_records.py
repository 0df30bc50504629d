"""What the gateway writes: nothing for a request OpenAI would refuse, one record per idempotency key,
and the end of each session it captures (the model's answer without a tool call, the finish call, or
idle time), after which the session is scored and read for training."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_support import WRITER, gateway_app, serving_on_loopback
from typer.testing import CliRunner

from sessionrl.cli import app as cli
from sessionrl.errors import NotFound
from sessionrl.gateway import ChatReply, ChatRequest, ScriptedChat
from sessionrl.gateway.capture import open_if_new, take_turn
from sessionrl.gateway.config import GatewayConfig
from sessionrl.gateway.ending import finish_idle
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.session.model import ToolRequest, utcnow
from sessionrl.skills import ExecutorConfig, SkillExecutor
from sessionrl.store import SessionStore
from sessionrl.train.llm.captured import stored_sessions

AUTH = {"Authorization": f"Bearer {WRITER}"}
TOOL = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
CALL = ToolRequest(id="call_1", name="search", arguments='{"q": "boots"}')
ASKED = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "boots"}'}}
USER = {"role": "user", "content": "boots?"}


class Counting:
    """A scripted backend (a tool call on the first turn, then text) that counts the requests it answers."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.asked: list[ChatRequest] = []
        self.delay_s = delay_s
        self.script = ScriptedChat.turns([ChatReply(tool_calls=(CALL,)), ChatReply(text="Two pairs.")])

    async def complete(self, request: ChatRequest, session_id: str) -> ChatReply:
        self.asked.append(request)
        await asyncio.sleep(self.delay_s)
        return await self.script.complete(request, session_id)

    async def models(self) -> list[str]:
        return ["scripted"]


def post(root: str, sid: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    url = f"{root}/gateway/sessions/{sid}/v1/chat/completions"
    return httpx.post(url, json=body, headers={**AUTH, **headers}, timeout=30)


def stored(root: str, sid: str) -> httpx.Response:
    return httpx.get(f"{root}/v1/sessions/{sid}", headers=AUTH)


@pytest.mark.parametrize(
    ("change", "param", "says"),
    [
        ({"temperature": "hot"}, "temperature", "valid number"),
        ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
        ({"stream": "yes"}, "stream", "valid boolean"),
        ({"n": 2}, "n", "less than or equal to 1"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name", ""),
        ({"tool_choice": "auto"}, "tool_choice", "only allowed when 'tools'"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed when 'stream'"),
        (
            {"messages": [USER, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
            "messages.[1].tool_call_id",
            "'call_9'",
        ),
        (
            {"messages": [USER, {"role": "assistant", "tool_calls": [ASKED]}, USER]},
            "messages.[2]",
            "these had none: call_1",
        ),
        ({"messages": [USER, {"role": "assistant", "content": None}]}, "messages.[1]", "'content' or"),
    ],
)
def test_a_request_openai_would_refuse_is_a_400_naming_the_field_and_nothing_is_recorded(
    tmp_path: Path, change: dict[str, Any], param: str, says: str
) -> None:
    backend = Counting()
    with serving_on_loopback(gateway_app(f"sqlite:///{tmp_path / 'g.db'}", chat=backend)) as root:
        offered = {} if "tool_choice" in change else {"tools": [TOOL]}
        answer = post(root, "bad-1", {"model": "m", "messages": [USER], **offered, **change})
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param)
        assert says in error["message"]
        assert stored(root, "bad-1").status_code == 404
    assert backend.asked == []


def test_the_same_key_replays_the_first_answer_and_another_body_under_it_is_a_422(tmp_path: Path) -> None:
    backend = Counting()
    db = f"sqlite:///{tmp_path / 'g.db'}"
    with serving_on_loopback(gateway_app(db, chat=backend)) as root:
        body = {"model": "m", "messages": [USER], "tools": [TOOL]}
        first = post(root, "idem-1", body, **{"Idempotency-Key": "turn-1"})
        again = post(root, "idem-1", body, **{"Idempotency-Key": "turn-1"})
        assert (first.status_code, again.status_code) == (200, 200)
        assert again.json()["id"] == first.json()["id"]
        assert again.json()["choices"] == first.json()["choices"]
        assert len(backend.asked) == 1  # the retry was answered from the record
        before = stored(root, "idem-1").json()
        other = {**body, "messages": [{"role": "user", "content": "socks?"}]}
        reused = post(root, "idem-1", other, **{"Idempotency-Key": "turn-1"})
        assert reused.status_code == 422
        assert reused.json()["error"]["code"] == "idempotency_key_reused"
        assert stored(root, "idem-1").json()["state_version"] == before["state_version"]
        # the header route keys the same way
        headed = {**AUTH, "X-Session-Id": "idem-2", "Idempotency-Key": "turn-1"}
        by_header = [httpx.post(f"{root}/v1/chat/completions", json=body, headers=headed) for _ in range(2)]
        assert [r.status_code for r in by_header] == [200, 200]
        assert by_header[0].json()["id"] == by_header[1].json()["id"] != first.json()["id"]
    with SessionStore.open(db) as store:
        assert len(store.get("idem-1").llm_calls) == 1
        assert len(store.get("idem-2").llm_calls) == 1
    assert len(backend.asked) == 2


def test_a_keyed_request_passing_on_an_integer_past_64_bits_is_answered_and_replayed(tmp_path: Path) -> None:
    backend = Counting()
    huge = -(2**63) - 1  # JSON has no integer bound, and neither has a field the gateway passes on
    with serving_on_loopback(gateway_app(f"sqlite:///{tmp_path / 'g.db'}", chat=backend)) as root:
        body = {"model": "m", "messages": [USER], "tools": [TOOL], "vendor": {"seed": huge}}
        first = post(root, "big-1", body, **{"Idempotency-Key": "turn-1"})
        again = post(root, "big-1", body, **{"Idempotency-Key": "turn-1"})
        assert (first.status_code, again.status_code) == (200, 200), first.text
        assert again.json()["id"] == first.json()["id"]
    assert [asked.model_extra for asked in backend.asked] == [{"vendor": {"seed": huge}}]


def test_concurrent_requests_under_one_key_share_one_turn_or_are_refused(tmp_path: Path) -> None:
    backend = Counting(delay_s=0.3)  # both requests arrive while the first is with the model
    with serving_on_loopback(gateway_app(f"sqlite:///{tmp_path / 'g.db'}", chat=backend)) as root:
        body = {"model": "m", "messages": [USER], "tools": [TOOL]}
        other = {**body, "messages": [{"role": "user", "content": "socks?"}]}
        with ThreadPoolExecutor(2) as pool:
            same = list(pool.map(lambda b: post(root, "con-1", b, **{"Idempotency-Key": "k"}), [body, body]))
            mixed = list(
                pool.map(lambda b: post(root, "con-2", b, **{"Idempotency-Key": "k"}), [body, other])
            )
        assert [r.status_code for r in same] == [200, 200]
        assert same[0].json() == same[1].json()
        assert sorted(r.status_code for r in mixed) == [200, 422]
        assert len(stored(root, "con-1").json()["llm_calls"]) == 1
        assert len(stored(root, "con-2").json()["llm_calls"]) == 1
    # one turn for con-1's two; con-2's other body is refused when it records (after the model, when it
    # arrived while the first was with the model) or at once (when it arrived after the first was recorded)
    assert len(backend.asked) in (2, 3)


def agent_turns(root: str, sid: str) -> None:
    """A tool call, its result, and the model's answer in text."""
    first = post(root, sid, {"model": "m", "messages": [USER], "tools": [TOOL]})
    assert first.status_code == 200, first.text
    messages = [
        USER,
        first.json()["choices"][0]["message"],
        {"role": "tool", "tool_call_id": "call_1", "content": '{"pairs": 2}'},
    ]
    second = post(root, sid, {"model": "m", "messages": messages, "tools": [TOOL]})
    assert second.json()["choices"][0]["message"]["content"] == "Two pairs."


def test_the_model_s_answer_without_a_tool_call_finishes_the_session_which_is_then_scored(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'g.db'}"
    with serving_on_loopback(gateway_app(db, chat=Counting())) as root:
        agent_turns(root, "end-1")
        session = stored(root, "end-1").json()
        assert session["state"] == "finished"
        assert session["metadata"]["finished_by"] == "final_answer"
        assert session["final_output"]["text"] == "Two pairs."
        more = post(root, "end-1", {"model": "m", "messages": [USER]})
        assert more.status_code == 409  # a finished session takes no more steps
    with SessionStore.open(db) as store:
        (changed,) = [e.event for e in store.events("end-1") if getattr(e.event, "state", None) == "finished"]
        assert getattr(changed, "reason", None) == "final_answer"
    scored = CliRunner().invoke(cli, ["rewards", "score", "--db", db], terminal_width=200)
    assert scored.exit_code == 0, scored.output
    assert "unfinished" not in scored.output
    with SessionStore.open(db) as store:
        assert len(store.rewards("end-1")) == 1
    trainable = stored_sessions(db, {"state": "finished", "tags": ["gateway"]})
    assert [s.session_id for s in trainable] == ["end-1"]


def test_a_session_ends_on_the_finish_call_or_when_idle(tmp_path: Path) -> None:
    config = GatewayConfig(finish_on_answer=False, idle_finish_s=0.2, sweep_every_s=0.05)
    db = f"sqlite:///{tmp_path / 'g.db'}"
    app = gateway_app(db, chat=Counting(), gateway=config)
    with serving_on_loopback(app) as root:
        agent_turns(root, "call-1")
        assert stored(root, "call-1").json()["state"] == "executing"  # the answer did not end it
        finished = httpx.post(f"{root}/v1/sessions/call-1/finish", json={"text": "bye"}, headers=AUTH)
        assert finished.status_code == 200, finished.text
        assert stored(root, "call-1").json()["metadata"]["finished_by"] == "finish_call"
        agent_turns(root, "idle-1")
        deadline = time.monotonic() + 20
        while stored(root, "idle-1").json()["state"] != "finished":
            assert time.monotonic() < deadline, "the idle session was never finished"
            time.sleep(0.05)
        session = stored(root, "idle-1").json()
    assert session["metadata"]["finished_by"] == "idle"
    assert session["final_output"]["text"] == "Two pairs."  # the last thing the model said


def test_every_error_under_the_gateway_s_paths_is_in_openai_s_shape(tmp_path: Path) -> None:
    app = gateway_app(f"sqlite:///{tmp_path / 'g.db'}", chat=Counting(), max_body_bytes=2000)
    with serving_on_loopback(app) as root:
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
        answers = {
            413: post(root, "big-1", big),  # the body limit answers before any route
            404: httpx.get(f"{root}/gateway/sessions/big-1/v1/nothing", headers=AUTH),
            405: httpx.put(f"{root}/gateway/sessions/big-1/v1/chat/completions", json={}, headers=AUTH),
        }
        for status, answer in answers.items():
            assert answer.status_code == status
            assert answer.headers["content-type"] == "application/json"
            assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
        assert stored(root, "big-1").status_code == 404


class WaitingForTheRecord:
    """A backend that answers (with `replies`, in turn) only once the store holds what the request
    brought before it: the session, and a tool step for each of its `tool` messages; it gives up after
    `patience_s`, and records whether it saw them, and whether they were stored already when it was
    called (not when they are committed beside the call)."""

    def __init__(self, store: SessionStore, replies: list[ChatReply], patience_s: float = 10.0) -> None:
        self.store = store
        self.replies = replies
        self.patience_s = patience_s
        self.saw_record: list[bool] = []
        self.stored_when_called: list[bool] = []

    async def complete(self, request: ChatRequest, session_id: str) -> ChatReply:
        sent = {m.tool_call_id for m in request.messages if m.role == "tool"}
        self.stored_when_called.append(self.stored(session_id, sent))
        deadline = time.monotonic() + self.patience_s
        while not self.stored(session_id, sent) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        self.saw_record.append(self.stored(session_id, sent))
        return self.replies[len(self.saw_record) - 1]

    def stored(self, session_id: str, tool_call_ids: set[str | None]) -> bool:
        try:
            session = self.store.get(session_id)
        except NotFound:
            return False
        return tool_call_ids <= {c.call_id for c in session.tool_calls}

    async def models(self) -> list[str]:
        return ["scripted"]


async def test_a_new_session_is_opened_while_the_backend_answers_and_each_turn_after_is_one_commit(
    tmp_path: Path,
) -> None:
    """The durable open of a session's first request runs beside the backend's call, not after it: a
    backend that waits for the session to be stored answers. Every later turn is one store transaction."""
    with SessionStore.open(f"sqlite:///{tmp_path / 'open.db'}") as store:
        backend = WaitingForTheRecord(store, [ChatReply(text="ok")] * 3)
        async with Orchestrator(store, SkillExecutor([], ExecutorConfig())) as engine:
            messages: list[dict[str, Any]] = [USER]
            for turn in range(3):
                request = ChatRequest.model_validate({"model": "m", "messages": messages})
                before = engine.committer.batches
                answered = await take_turn(engine, backend, "s-open", request, f"chatcmpl-{turn}")
                assert answered.reply is not None
                assert answered.reply.text == "ok"
                assert engine.committer.batches - before == (2 if turn == 0 else 1)
                messages = [
                    *messages,
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": "more"},
                ]
        assert backend.saw_record == [True, True, True]
        assert backend.stored_when_called == [False, True, True]
        session = store.get("s-open")
        assert [c.call_id for c in session.llm_calls] == ["chatcmpl-0", "chatcmpl-1", "chatcmpl-2"]
        assert session.metadata["captured_by"] == "gateway"


async def test_a_request_s_tool_results_are_recorded_while_the_backend_answers(tmp_path: Path) -> None:
    """The tool step a request brings is committed beside the backend's call (a backend that waits for
    it answers), and comes before the model call it led to in the session."""
    with SessionStore.open(f"sqlite:///{tmp_path / 'tools.db'}") as store:
        backend = WaitingForTheRecord(store, [ChatReply(tool_calls=(CALL,)), ChatReply(text="Two pairs.")])
        async with Orchestrator(store, SkillExecutor([], ExecutorConfig())) as engine:
            first = ChatRequest.model_validate({"model": "m", "messages": [USER], "tools": [TOOL]})
            await take_turn(engine, backend, "s-tools", first, "chatcmpl-a")
            answer = {"role": "tool", "tool_call_id": "call_1", "content": '{"pairs": 2}'}
            body = {
                "model": "m",
                "tools": [TOOL],
                "messages": [USER, {"role": "assistant", "tool_calls": [ASKED]}, answer],
            }
            second = await take_turn(
                engine, backend, "s-tools", ChatRequest.model_validate(body), "chatcmpl-b"
            )
        assert second.reply is not None
        assert second.reply.text == "Two pairs."
        assert backend.saw_record == [True, True]
        assert backend.stored_when_called == [False, False]  # committed beside the call, not before it
        session = store.get("s-tools")
        assert [c.call_id for c in session.tool_calls] == ["call_1"]
        assert session.tool_calls[0].output == {"pairs": 2}
        steps = [e.event.type for e in store.events("s-tools")]
        assert [t for t in steps if t in ("tool_call", "llm_call")] == ["llm_call", "tool_call", "llm_call"]


async def test_a_sweep_projects_a_bounded_slice_of_the_backlog_and_later_sweeps_reach_the_rest(
    tmp_path: Path,
) -> None:
    """A sweep does not drain the store's whole backlog in the serving process: with a budget of one
    outbox row it sees one more idle session each time; an unbounded sweep sees them all."""
    later = utcnow() + timedelta(hours=1)
    with SessionStore.open(f"sqlite:///{tmp_path / 'sweep.db'}") as store:
        async with Orchestrator(store, SkillExecutor([], ExecutorConfig())) as engine:
            for n in range(4):  # one outbox row each: opened, never reached again
                await open_if_new(engine, f"idle-{n}", ChatRequest.model_validate({"messages": [USER]}))
            first = await finish_idle(engine, 60, later, projection_rows=1)
            second = await finish_idle(engine, 60, later, projection_rows=1)
            rest = await finish_idle(engine, 60, later)
        assert {store.get(f"idle-{n}").state.value for n in range(4)} == {"finished"}
    assert (first, second) == (["idle-0"], ["idle-1"])
    assert sorted(rest) == ["idle-2", "idle-3"]
