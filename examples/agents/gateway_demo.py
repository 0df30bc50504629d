"""The example agent (`openai_agent.py`) on `orders` tasks, recorded through sessionrl's gateway.

It starts the service on loopback over the store at `--db`, its gateway answered by a scripted model
that calls the tools of the domain's expert plan one turn at a time (real OpenAI tool calls), then runs
the agent on each task with its base URL naming a session, the domain's tools running on the agent's
side. Each session ends up in the store with its LLM steps, tool steps and a rating posted afterwards.

    python examples/agents/gateway_demo.py --tasks 3

`ExpertPolicy` is the same expert as a policy backend for the gateway's own-policy path, speaking a tiny
policy's action language in its tokens: what the round trip (`tests/capture/test_round_trip.py`,
`bench/round_trip.py`) captures and then trains on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import httpx
import orjson
import uvicorn

from sessionrl.cli.sessions import store_url
from sessionrl.envs.base import DecisionEnv, Episode, Split, Task
from sessionrl.envs.registry import build
from sessionrl.gateway import ChatReply, ChatRequest, ScriptedChat
from sessionrl.orchestrator.policy import PolicyReply
from sessionrl.policy.references import Context, abstract
from sessionrl.policy.toolcalls import ToolFormat, write_call, write_final
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.session.model import Message, ToolRequest
from sessionrl.skills import SystemClock

if TYPE_CHECKING:  # the scripted demo runs without torch's import time
    from sessionrl.policy.llm import HFPolicy

ACTION = ToolFormat.ACTION
"""The tiny policy's tool-call format, which `ExpertPolicy` writes."""


class OrdersDesk:
    """The orders domain as an agent sees it (OpenAI function tools, and an episode per task to run them
    in), with a scripted model answering a task's k-th turn with the expert's k-th tool call."""

    def __init__(
        self,
        n_tasks: int,
        split: Split = Split.TEST,
        *,
        env: DecisionEnv | None = None,
        select: Callable[[Task], bool] = lambda task: True,
    ) -> None:
        self.env: DecisionEnv = env if env is not None else build("orders")
        self.tasks: Sequence[Task] = [t for t in self.env.tasks(split) if select(t)][:n_tasks]
        self.tools = [c.to_openai_tool() for c in self.env.contracts()]
        self._by_instruction = {t.instruction: t for t in self.tasks}

    def episode(self, task: Task) -> tuple[Episode, Callable[[str, dict[str, Any]], Any]]:
        """A fresh episode of `task`, and the agent's tool function over it."""
        episode = self.env.episode(task)
        skills = {s.contract.name: s for s in episode.skills()}
        clock = SystemClock()

        def call_tool(name: str, arguments: dict[str, Any]) -> Any:
            return asyncio.run(skills[name].invoke(arguments, clock))

        return episode, call_tool

    def metadata(self, task: Task) -> dict[str, str]:
        """What the agent tells the gateway about its session: the environment and task, which let
        training replay the task (GRPO on captured sessions)."""
        return {"env": "orders", "task_id": task.task_id}

    def task_of(self, instruction: str) -> Task:
        """The desk's task whose instruction this is (the user's first message)."""
        return self._by_instruction[instruction]

    def reply(self, request: ChatRequest) -> ChatReply:
        """The expert's next call for the request's task, or its final message once every call is made."""
        task = self.task_of(next(m.text for m in request.messages if m.role == "user"))
        plan = self.env.expert(task)
        turn = sum(m.role == "assistant" for m in request.messages)
        if turn >= len(plan.steps):
            return ChatReply(text=plan.final_message, usage={"prompt_tokens": 50, "completion_tokens": 9})
        step = plan.steps[turn]
        arguments = orjson.dumps(dict(step.params)).decode()
        call = ToolRequest(id=f"call_{task.task_id}_{turn}", name=step.tool, arguments=arguments)
        return ChatReply(tool_calls=(call,), usage={"prompt_tokens": 40, "completion_tokens": 12})

    def backend(self) -> ScriptedChat:
        """The scripted model."""
        return ScriptedChat(self.reply, model="scripted-expert")

    def actions(self, task: Task, outputs: Sequence[Any]) -> list[str]:
        """The expert's turns on `task` in the tiny policy's action language, as the demo's demonstrations
        write them: each value the conversation already holds (the request, and the results `outputs` the
        agent sent back for the calls before) becomes a reference such as ``{{user.order}}``, which the
        gateway resolves before the agent sees it."""
        plan = self.env.expert(task)
        results = list(zip((step.tool for step in plan.steps), outputs, strict=False))
        calls = [
            write_call(
                ACTION, step.tool, abstract(dict(step.params), Context.of(task.instruction, results[:k]))
            )
            for k, step in enumerate(plan.steps)
        ]
        answer = abstract(plan.final_message, Context.of(task.instruction, results))
        return [*calls, write_final(ACTION, answer)]

    def corpus(self) -> list[str]:
        """The texts a tiny policy's tokenizer learns for this desk: each task's request, the expert's
        actions (`actions`) and the tools' results as the agent sends them back (JSON)."""
        texts = []
        for task in self.tasks:
            _, call_tool = self.episode(task)
            outputs = [call_tool(step.tool, dict(step.params)) for step in self.env.expert(task).steps]
            texts += [task.instruction, *self.actions(task, outputs), *map(json.dumps, outputs)]
        return texts


class ExpertPolicy:
    """A policy backend (for `PolicyChat`) answering a desk task's turn with the expert's action
    (`OrdersDesk.actions`), reporting the served policy's tokens for the prompt and the reply: sessions
    captured through it carry the token ids of the model that training then updates."""

    def __init__(self, desk: OrdersDesk, served: HFPolicy) -> None:
        self.desk, self.served = desk, served

    async def generate(self, messages: Sequence[Message], *, purpose: str) -> PolicyReply:
        task = self.desk.task_of(next(m.content for m in messages if m.role == "user"))
        outputs = [orjson.loads(m.content) for m in messages if m.role == "tool"]
        text = self.desk.actions(task, outputs)[sum(m.role == "assistant" for m in messages)]
        prompt = self.served.encode_prompt(messages)
        return PolicyReply(
            text=text, prompt_token_ids=tuple(prompt), token_ids=tuple(self.served.encode_reply(text))
        )


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """`app` on a free loopback port, in a thread; yields its root URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("the service did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def main() -> None:
    from openai import OpenAI
    from openai_agent import run_agent  # beside this file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3, help="Orders tasks to run.")
    parser.add_argument("--db", default="runs/sessions.db", help="The session store (a path or a URL).")
    args = parser.parse_args()
    token = secrets.token_urlsafe(16)
    desk = OrdersDesk(args.tasks)
    config = ServiceConfig(db_url=store_url(args.db), tokens=parse_tokens(f"{token}:read,write"))
    solved = 0
    with serving(create_app(config, skills=[], chat=desk.backend())) as root:
        auth = {"Authorization": f"Bearer {token}"}
        for task in desk.tasks:
            episode, call_tool = desk.episode(task)
            client = OpenAI(base_url=f"{root}/gateway/sessions/{task.task_id}/v1", api_key=token)
            final = run_agent(
                client,
                task.instruction,
                desk.tools,
                call_tool,
                model="scripted-expert",
                metadata=desk.metadata(task),
            )
            ok = episode.success([final])
            solved += ok
            rating = {"type": "human_rating", "score": 5 if ok else 2, "annotator": "demo"}
            httpx.post(
                f"{root}/v1/sessions/{task.task_id}/feedback", json=rating, headers=auth
            ).raise_for_status()
            session = httpx.get(f"{root}/v1/sessions/{task.task_id}", headers=auth).json()
            print(
                f"{task.task_id}: {'solved' if ok else 'unsolved'}, {len(session['llm_calls'])} LLM steps, "
                f"{len(session['tool_calls'])} tool steps recorded"
            )
    print(json.dumps({"tasks": len(desk.tasks), "solved": solved, "db": args.db}))


if __name__ == "__main__":
    main()
