"""The round trip: an unchanged OpenAI agent's sessions captured through the gateway with the served
policy's token ids, `sessionrl train` (SFT on `data: store`) from them, and the trained policy served
back through the gateway, compared with the untrained one on the same held-out tasks.

The gateway's own-policy backend serves a tiny policy here, driven by the orders expert: it answers with
the expert's next action and reports the served policy's tokens for the prompt and the reply, so the
captured sessions carry token ids of the very model that training then updates. The agent stops after
its first model call (each captured session is that one call), which keeps the sequences short.

What is compared is what a tiny model trained for seconds can move: how many held-out tickets get, as
its first answer, a well-formed call of the tool the expert calls first. In that time the policy learns
the action format and the common first tools (a constant guess of the most common one is printed beside
the scores, for scale; telling every ticket apart takes longer), and whole tickets stay unsolved by both
(solving one needs ids and amounts copied, which takes a tiny model minutes of training), so task
success is not what this test compares (`bench/round_trip.py` compares it, after the hundreds of steps
it takes). Both policies answer the same held-out tickets, greedily, through the same gateway and agent.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
from openai import OpenAI

from example_agents_support import load_example
from sessionrl.capture.dataset import stored_sessions
from sessionrl.envs.base import Split, Task
from sessionrl.envs.registry import build
from sessionrl.gateway import PolicyChat
from sessionrl.orchestrator.policy import PolicyReply
from sessionrl.policy.llm import HFPolicy, SamplingConfig, final_action, tool_action
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.session.model import Message
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.loop import train_sft
from sessionrl.train.llm.run import split_digits

ENV = {"train": 24, "dev": 2, "test": 12}
MODEL = TinyModelConfig(vocab_size=700, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
GREEDY = SamplingConfig(max_new_tokens=40, temperature=0)
WRITER = "writer"


AGENT, DEMO = load_example("openai_agent"), load_example("gateway_demo")


def gateway(db: Path, chat: PolicyChat) -> Any:
    """A service over the store at `db` (no skills of its own) whose gateway answers with `chat`."""
    config = ServiceConfig(db_url=f"sqlite:///{db}", tokens=parse_tokens(f"{WRITER}:read,write"))
    return DEMO.serving(create_app(config, skills=[], chat=chat))


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """A tiny model gains nothing from threads, and on a busy machine they wait on each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class ExpertPolicy:
    """A policy backend answering with the orders expert's next action, in the served policy's tokens."""

    def __init__(self, desk: Any, served: HFPolicy) -> None:
        self.desk, self.served = desk, served

    async def generate(self, messages: Sequence[Message], *, purpose: str) -> PolicyReply:
        task = self.desk.task_of(next(m.content for m in messages if m.role == "user"))
        plan = self.desk.env.expert(task)
        turn = sum(m.role == "assistant" for m in messages)
        if turn < len(plan.steps):
            text = tool_action(plan.steps[turn].tool, dict(plan.steps[turn].params))
        else:
            text = final_action(plan.final_message)
        prompt = self.served.encode_prompt(messages)
        return PolicyReply(
            text=text, prompt_token_ids=tuple(prompt), token_ids=tuple(self.served.encode_reply(text))
        )


def served_policy(desk: Any, folder: Path) -> Path:
    """A tiny policy whose tokenizer knows the domain's texts (the requests and the expert's actions)."""
    texts = [task.instruction for task in desk.env.tasks(Split.TRAIN)]
    for task in desk.env.tasks(Split.TRAIN):
        plan = desk.env.expert(task)
        texts += [tool_action(s.tool, dict(s.params)) for s in plan.steps]
        texts.append(final_action(plan.final_message))
    _, tokenizer = build_tiny_policy(texts, MODEL, folder)
    split_digits(tokenizer)
    tokenizer.save_pretrained(folder)
    return folder


def first_calls(desk: Any, policy: HFPolicy, tasks: Sequence[Task], db: Path) -> list[str | None]:
    """The tool each held-out task's first answer calls (None: an answer that calls none), served by
    `policy` through the gateway to the example agent."""
    called: list[str | None] = []
    with gateway(db, PolicyChat([policy])) as root:
        for task in tasks:
            client = OpenAI(base_url=f"{root}/gateway/sessions/{task.task_id}/v1", api_key=WRITER)
            first: list[str] = []

            def note(name: str, arguments: dict[str, Any], first: list[str] = first) -> Any:
                first.append(name)
                return {"note": "held out: the episode stops at the first call"}

            AGENT.run_agent(client, task.instruction, desk.tools, note, max_turns=1)
            called.append(first[0] if first else None)
    return called


def test_captured_sessions_train_a_policy_that_beats_the_untrained_one_on_held_out_tasks(
    tmp_path: Path,
) -> None:
    env = build("orders", **ENV)
    desk = DEMO.OrdersDesk(n_tasks=ENV["train"], split=Split.TRAIN, env=env)
    served = served_policy(desk, tmp_path / "served")
    teacher = ExpertPolicy(desk, HFPolicy.load(served, GREEDY))
    # capture: the example agent, recorded through the gateway with the served policy's tokens
    url = f"sqlite:///{tmp_path / 'captured.db'}"
    with gateway(tmp_path / "captured.db", PolicyChat([teacher])) as root:
        for task in desk.tasks:
            _, call_tool = desk.episode(task)
            client = OpenAI(base_url=f"{root}/gateway/sessions/{task.task_id}/v1", api_key=WRITER)
            AGENT.run_agent(client, task.instruction, desk.tools, call_tool, max_turns=1)
    captured = stored_sessions(url, {"tags": ["gateway"]})
    assert all(c.token_ids for s in captured for c in s.llm_calls)
    # train: sessionrl train, SFT on the captured sessions, the served policy as the starting point
    config = RunConfig.model_validate(
        {
            "run_dir": str(tmp_path / "run"),
            "trainer": "sft",
            "env": ENV,
            "model": {"path": str(served)},
            "sft": {
                "data": "store",
                "store": {"db": url, "filters": {"tags": ["gateway"]}},
                "trainer": {"lr": 0.01, "steps": 120, "batch_sessions": 24, "token_budget": 8192},
            },
            "evaluation": {"tasks": 1, "max_new_tokens": 4},
        }
    )
    train_sft(config)
    records = [orjson.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_bytes().splitlines()]
    (kept,) = [r for r in records if r["stage"] == "captured"]
    assert (kept["kept"], kept["dropped"]) == (ENV["train"], 0)
    # serve both back: the same held-out tasks, the same agent, greedy answers
    held_out = env.tasks(Split.TEST)
    expected = [env.expert(t).steps[0].tool for t in held_out]
    scores = {}
    for label, folder in (("untrained", served), ("trained", tmp_path / "run" / "sft_policy")):
        called = first_calls(desk, HFPolicy.load(folder, GREEDY), held_out, tmp_path / f"{label}.db")
        scores[label] = sum(c == e for c, e in zip(called, expected, strict=True))
        print(f"{label} first calls: {called}")
    scores["always the most common tool"] = max(expected.count(tool) for tool in expected)
    print(f"held-out first calls right, of {len(held_out)}: {scores}")
    assert scores["trained"] > scores["untrained"]
