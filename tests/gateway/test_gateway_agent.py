"""An unchanged OpenAI agent (examples/agents/openai_agent.py) recorded through the gateway, end to end."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import httpx
import orjson
import pytest
from gateway_support import REPO, WRITER, OrdersDesk, gateway_app, load_example, serving_on_loopback
from openai import OpenAI

from sessionrl.eval.metrics import tool_call_success_rate
from sessionrl.gateway import ChatReply, ScriptedChat
from sessionrl.orchestrator.recording import TOOL_ERROR
from sessionrl.session.model import CallStatus, ToolRequest
from sessionrl.store import SessionStore


def load_agent() -> ModuleType:
    return load_example("openai_agent")


def test_the_example_agent_imports_nothing_of_sessionrl() -> None:
    source = (REPO / "examples" / "agents" / "openai_agent.py").read_text(encoding="utf-8")
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert imports
    assert not [line for line in imports if "sessionrl" in line]


def test_the_agent_solves_orders_tasks_and_its_sessions_are_recorded(tmp_path: Path) -> None:
    agent, desk = load_agent(), OrdersDesk(n_tasks=3)
    app = gateway_app(f"sqlite:///{tmp_path / 'sessions.db'}", chat=desk.backend())
    with (
        serving_on_loopback(app) as root,
        httpx.Client(base_url=root, headers={"Authorization": f"Bearer {WRITER}"}) as api,
    ):
        for task in desk.tasks:
            episode, call_tool = desk.episode(task)
            client = OpenAI(
                base_url=f"{root}/gateway/sessions/{task.task_id}/v1", api_key=WRITER, max_retries=0
            )
            final = agent.run_agent(client, task.instruction, desk.tools, call_tool, model="gpt-agent")
            assert episode.success([final]), task.task_id
            session = api.get(f"/v1/sessions/{task.task_id}").json()
            steps = len(desk.env.expert(task).steps)
            assert len(session["llm_calls"]) == steps + 1
            assert [c["tool"] for c in session["tool_calls"]] == [s.tool for s in desk.env.expert(task).steps]
            # the service serves no skills: the agent's tools are its own, recorded as free-form
            assert all(c["recorded"] and c["free_form"] for c in session["tool_calls"])
            assert all(c["status"] == "success" and c["output"] is not None for c in session["tool_calls"])
            assert session["tool_calls"][0]["call_id"] == f"call_{task.task_id}_0"
            assert session["llm_calls"][-1]["response"] == final
            assert session["llm_calls"][0]["model"] == "scripted-expert"
            assert session["llm_calls"][0]["usage"]["completion_tokens"] == 12
        # late feedback, against the session and against one call by its id
        sid = desk.tasks[0].task_id
        call_id = api.get(f"/v1/sessions/{sid}").json()["llm_calls"][0]["call_id"]
        rating = api.post(f"/v1/sessions/{sid}/feedback", json={"type": "human_rating", "score": 5})
        about_call = api.post(
            f"/v1/sessions/{sid}/feedback",
            json={"type": "comment", "comment": "good first call", "anchor": {"call_id": call_id}},
        )
        assert (rating.status_code, about_call.status_code) == (201, 201)
        assert len(api.get(f"/v1/sessions/{sid}").json()["feedback"]) == 2


@pytest.mark.parametrize("where", ["path", "header"])
def test_a_session_is_named_by_base_url_or_header(tmp_path: Path, where: str) -> None:
    desk = OrdersDesk(n_tasks=1)
    task = desk.tasks[0]
    app = gateway_app(f"sqlite:///{tmp_path / 'sessions.db'}", chat=desk.backend())
    with serving_on_loopback(app) as root:
        if where == "path":
            client = OpenAI(base_url=f"{root}/gateway/sessions/s-{where}/v1", api_key=WRITER, max_retries=0)
        else:
            client = OpenAI(
                base_url=f"{root}/v1",
                api_key=WRITER,
                default_headers={"X-Session-Id": f"s-{where}"},
                max_retries=0,
            )
        answer = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": task.instruction}], tools=desk.tools
        )
        assert answer.choices[0].finish_reason == "tool_calls"
        assert client.models.list().data[0].id == "scripted-expert"
        session = httpx.get(
            f"{root}/v1/sessions/s-{where}", headers={"Authorization": f"Bearer {WRITER}"}
        ).json()
        assert session["user_query"] == task.instruction
        assert session["llm_calls"][0]["call_id"] == answer.id
        assert session["metadata"]["free_form_tools"] is True


def test_a_tool_message_reporting_an_error_is_recorded_as_a_failed_call(tmp_path: Path) -> None:
    agent = load_agent()
    calls = [
        ToolRequest(id=f"call_{i}", name="lookup_order", arguments=orjson.dumps({"order_id": o}).decode())
        for i, o in enumerate(("O-404", "O-1"))
    ]
    replies = [
        ChatReply(tool_calls=(calls[0],)),
        ChatReply(tool_calls=(calls[1],)),
        ChatReply(text="Shipped."),
    ]
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    with serving_on_loopback(gateway_app(url, chat=ScriptedChat.turns(replies))) as root:
        client = OpenAI(base_url=f"{root}/gateway/sessions/err-1/v1", api_key=WRITER, max_retries=0)
        final = agent.run_agent(client, "Where is my order?", [agent.LOOKUP_ORDER], agent.lookup_order)
    assert final == "Shipped."
    with SessionStore.open(url) as store:
        session = store.get("err-1")
    failed, found = session.tool_calls
    # the agent's tool answered {"error": "no such order"} for O-404: a failed call, by the gateway's rule
    assert (failed.status, failed.error_code, failed.error_message) == (
        CallStatus.ERROR,
        TOOL_ERROR,
        "no such order",
    )
    assert failed.output is None
    assert (found.status, found.output) == (CallStatus.SUCCESS, agent.ORDERS["O-1"])
    assert tool_call_success_rate([session]) == 0.5
