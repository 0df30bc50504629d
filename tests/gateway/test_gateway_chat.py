"""The gateway's chat route: streaming with the openai package, the service's own policy as the backend
(its token ids and log-probabilities recorded), and the errors an agent can meet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_support import WRITER, OrdersDesk, gateway_app, serving_on_loopback
from openai import OpenAI

from sessionrl.gateway import ChatReply, ScriptedChat
from sessionrl.orchestrator.policy import PolicyReply, ScriptedBackend
from sessionrl.session.model import ToolRequest

AUTH = {"Authorization": f"Bearer {WRITER}"}
TOOL = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}


def recorded(root: str, sid: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{root}/v1/sessions/{sid}", headers=AUTH).json()
    return body


def test_a_streamed_answer_reaches_the_openai_client_whole_and_is_recorded(tmp_path: Path) -> None:
    call = ToolRequest(id="call_s1", name="search", arguments='{"q": "boots"}')
    backend = ScriptedChat.turns(
        [
            ChatReply(tool_calls=(call,), usage={"prompt_tokens": 7, "completion_tokens": 4}),
            ChatReply(text="Two pairs."),
        ]
    )
    with serving_on_loopback(gateway_app(f"sqlite:///{tmp_path / 'g.db'}", chat=backend)) as root:
        client = OpenAI(base_url=f"{root}/gateway/sessions/st-1/v1", api_key=WRITER, max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "boots?"}]
        stream = client.chat.completions.create(
            model="m", messages=messages, tools=[TOOL], stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        (streamed_call,) = [t for d in deltas for t in d.tool_calls or ()]
        assert (streamed_call.id, streamed_call.function.name) == ("call_s1", "search")
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.total_tokens == 11
        messages += [
            {"role": "assistant", "tool_calls": [streamed_call.model_dump(exclude={"index"})]},
            {"role": "tool", "tool_call_id": "call_s1", "content": "2 pairs in stock"},
        ]
        text = "".join(
            d.content or ""
            for c in client.chat.completions.create(model="m", messages=messages, tools=[TOOL], stream=True)
            for d in [c.choices[0].delta]
            if c.choices
        )
        assert text == "Two pairs."
        session = recorded(root, "st-1")
    assert [c["response"] for c in session["llm_calls"]] == ["", "Two pairs."]
    assert session["tool_calls"][0]["output"] == "2 pairs in stock"  # not JSON: kept as the text it is


def test_the_service_policy_answers_and_its_sampled_tokens_are_recorded(tmp_path: Path) -> None:
    policy = ScriptedBackend(
        [
            PolicyReply(
                text='{"tool":"search","params":{"q":"boots"}}',
                prompt_token_ids=(1, 2, 3),
                token_ids=(7, 8),
                logprobs=(-0.5, -0.1),
            ),
            PolicyReply(
                text='{"final":"Two pairs."}', prompt_token_ids=(1, 2, 3, 9), token_ids=(4,), logprobs=(-0.2,)
            ),
        ]
    )
    with serving_on_loopback(gateway_app(f"sqlite:///{tmp_path / 'g.db'}", backends=[policy])) as root:
        client = OpenAI(base_url=f"{root}/gateway/sessions/pol-1/v1", api_key=WRITER, max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "boots?"}]
        first = client.chat.completions.create(model="m", messages=messages, tools=[TOOL])
        (call,) = first.choices[0].message.tool_calls or ()
        assert (call.function.name, call.function.arguments) == ("search", '{"q":"boots"}')
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"pairs": 2}'},
        ]
        second = client.chat.completions.create(model="m", messages=messages, tools=[TOOL])
        assert second.choices[0].message.content == "Two pairs."
        assert second.usage is not None
        assert second.usage.completion_tokens == 1
        session = recorded(root, "pol-1")
    asked, answered = session["llm_calls"]
    assert (asked["prompt_token_ids"], asked["token_ids"], asked["logprobs"]) == (
        [1, 2, 3],
        [7, 8],
        [-0.5, -0.1],
    )
    assert answered["token_ids"] == [4]
    # the policy read its own earlier tool call in its action language, and the tool's answer
    conversation = policy.calls[1][0]
    assert conversation[1].content == '{"tool":"search","params":{"q":"boots"}}'
    assert conversation[2].role == "tool"


def test_the_errors_an_agent_meets_are_openai_errors(tmp_path: Path) -> None:
    desk = OrdersDesk(n_tasks=1)
    user = [{"role": "user", "content": desk.tasks[0].instruction}]
    with serving_on_loopback(gateway_app(f"sqlite:///{tmp_path / 'g.db'}", chat=desk.backend())) as root:
        no_session = OpenAI(base_url=f"{root}/v1", api_key=WRITER, max_retries=0)
        with pytest.raises(openai.BadRequestError) as unnamed:
            no_session.chat.completions.create(model="m", messages=user)
        assert (unnamed.value.code, unnamed.value.param) == ("missing_session", "X-Session-Id")
        assert "/gateway/sessions/{session_id}/v1" in unnamed.value.message
        stranger = OpenAI(base_url=f"{root}/gateway/sessions/e-1/v1", api_key="nobody", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            stranger.chat.completions.create(model="m", messages=user)
        assert refused.value.body == {
            "message": "unknown token",
            "type": "authentication_error",
            "param": None,
            "code": "unauthorized",
        }
        client = OpenAI(base_url=f"{root}/gateway/sessions/e-1/v1", api_key=WRITER, max_retries=0)
        client.chat.completions.create(model="m", messages=user)
        finished = httpx.post(f"{root}/v1/sessions/e-1/finish", json={"text": "bye"}, headers=AUTH)
        assert finished.status_code == 200, finished.text
        with pytest.raises(openai.ConflictError) as conflict:
            client.chat.completions.create(model="m", messages=user)
        assert conflict.value.code == "invalid_transition"
    with serving_on_loopback(gateway_app(f"sqlite:///{tmp_path / 'h.db'}")) as root:
        client = OpenAI(base_url=f"{root}/gateway/sessions/e-2/v1", api_key=WRITER, max_retries=0)
        with pytest.raises(openai.InternalServerError, match="no chat backend"):
            client.chat.completions.create(model="m", messages=user)


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        (b'{"model": "m", "messages": [', "malformed_json", "line 1, column 29 (character 28)"),
        (b'{"model": "m", "messages": []}', "invalid_request", "messages: List should have at least 1"),
        (b'{"messages": [{"role": "robot", "content": "hi"}]}', "invalid_request", "messages.0.role"),
    ],
)
def test_a_body_the_gateway_cannot_read_is_an_openai_400_and_nothing_is_recorded(
    tmp_path: Path, body: bytes, code: str, says: str
) -> None:
    backend = ScriptedChat(lambda request: ChatReply(text="ok"))
    with serving_on_loopback(gateway_app(f"sqlite:///{tmp_path / 'g.db'}", chat=backend)) as root:
        answer = httpx.post(
            f"{root}/gateway/sessions/bad-1/v1/chat/completions",
            content=body,
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert answer.status_code == 400
        assert answer.headers["content-type"] == "application/json"
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", code)
        assert says in error["message"]
        assert httpx.get(f"{root}/v1/sessions/bad-1", headers=AUTH).status_code == 404


def test_the_shortcut_serves_the_chat_routes_and_answers_their_errors_in_openai_form(tmp_path: Path) -> None:
    backend = ScriptedChat(lambda request: ChatReply(text="ok"))
    # a bucket of 2 refilled once per 100 s: the third request is refused
    app = gateway_app(f"sqlite:///{tmp_path / 'g.db'}", chat=backend, rate_per_s=0.01, rate_burst=2)
    served = {route.path for route in app.build_middleware_stack().served}
    assert {"/gateway/sessions/{session_id}/v1/chat/completions", "/v1/chat/completions"} <= served
    with serving_on_loopback(app) as root:
        client = OpenAI(base_url=f"{root}/gateway/sessions/rate-1/v1", api_key=WRITER, max_retries=0)
        user: list[Any] = [{"role": "user", "content": "hi"}]
        assert client.chat.completions.create(model="m", messages=user).choices[0].message.content == "ok"
        assert len(recorded(root, "rate-1")["llm_calls"]) == 1  # the second request of the bucket
        with pytest.raises(openai.RateLimitError) as limited:
            client.chat.completions.create(model="m", messages=user)
    assert (limited.value.code, limited.value.type) == ("rate_limited", "rate_limit_error")
    assert limited.value.response.headers["retry-after"]
