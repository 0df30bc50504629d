"""The round trip: an unchanged OpenAI agent's sessions captured through the gateway with the served
policy's token ids, `sessionrl train` (SFT on `data: store`) from them, and the trained policy served
back through the gateway, solving more held-out tasks than the untrained one.

The gateway's own-policy backend serves a tiny policy here (the demo's model shape and SFT recipe,
`sessionrl.train.llm.demo.demo_config`), driven by the orders expert while sessions are captured: it
answers each turn with the expert's next action, written as the demo's demonstrations write it (values
the conversation already holds become references such as ``{{user.order}}`` or
``{{inventory_check.on_hand}}``, which the gateway resolves before the agent sees them), and reports the
served policy's tokens for the prompt and the reply. So the captured sessions carry token ids of the very
model that training then updates, and they teach what the demo's demonstrations teach: which tools a
ticket needs, in which order, pointing at ids and amounts rather than copying them digit by digit (which
a tiny model learns only after far more training than a test can afford).

The agent sends no system prompt (the tiny policy reads the conversation only: the ticket, its own
actions, the tools' results), and tasks of every kind are captured. Both policies then answer the same
held-out test tickets (never captured), greedily, through the same gateway and agent, and the
environment's judge says which were solved; `bench/round_trip.py` runs the same pipeline on more
held-out tickets and reports McNemar's p.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
from openai import OpenAI

from example_agents_support import load_example
from sessionrl.envs.base import Split, Task
from sessionrl.envs.registry import build
from sessionrl.gateway import PolicyChat
from sessionrl.orchestrator.policy import PolicyBackend
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.tiny import build_tiny_policy
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.captured import stored_sessions
from sessionrl.train.llm.demo import demo_config
from sessionrl.train.llm.loop import train_sft
from sessionrl.train.llm.run import split_digits

ENV = {"train": 160, "dev": 1, "test": 24}
DEMO_RUN = demo_config()
GREEDY = SamplingConfig(max_new_tokens=64, temperature=0)
MAX_TURNS = 8
MARGIN = 4
WRITER = "writer"

AGENT, DEMO = load_example("openai_agent"), load_example("gateway_demo")

pytestmark = pytest.mark.slow


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


def served_policy(desk: Any, folder: Path) -> Path:
    """A tiny policy whose tokenizer knows the domain's texts: the requests, the expert's actions and the
    tools' results as the agent sends them back."""
    _, tokenizer = build_tiny_policy(desk.corpus(), DEMO_RUN.model.tiny, folder)
    split_digits(tokenizer)
    tokenizer.save_pretrained(folder)
    return folder


def solved(desk: Any, policy: PolicyBackend, tasks: Sequence[Task], db: Path) -> list[bool]:
    """Whether the example agent, `policy` answering it through the gateway (over a store at `db`) and the
    domain's tools running on its side, solved each task, as the environment's judge says."""
    outcomes = []
    with gateway(db, PolicyChat([policy])) as root:
        for task in tasks:
            episode, call_tool = desk.episode(task)
            client = OpenAI(base_url=f"{root}/gateway/sessions/{task.task_id}/v1", api_key=WRITER)
            final = AGENT.run_agent(client, task.instruction, desk.tools, call_tool, max_turns=MAX_TURNS)
            outcomes.append(bool(episode.success([final])))
    return outcomes


@pytest.mark.timeout(1200)  # a few minutes of CPU, which on a crowded machine takes many more of the clock
def test_captured_sessions_train_a_policy_that_solves_more_held_out_tasks_than_the_untrained_one(
    tmp_path: Path,
) -> None:
    env = build("orders", **ENV)
    desk = DEMO.OrdersDesk(n_tasks=ENV["train"], split=Split.TRAIN, env=env)
    served = served_policy(desk, tmp_path / "served")
    # capture: the example agent, recorded through the gateway with the served policy's tokens
    url = f"sqlite:///{tmp_path / 'captured.db'}"
    taught = solved(
        desk, DEMO.ExpertPolicy(desk, HFPolicy.load(served, GREEDY)), desk.tasks, tmp_path / "captured.db"
    )
    captured = stored_sessions(url, {"tags": ["gateway"]})
    assert len(captured) == ENV["train"]
    assert all(c.token_ids for s in captured for c in s.llm_calls)
    assert sum(taught) > ENV["train"] * 0.9  # the expert's tickets, nearly all solved
    # train: sessionrl train, SFT on the captured sessions (the demo's recipe), from the served policy
    config = RunConfig.model_validate(
        {
            "run_dir": str(tmp_path / "run"),
            "trainer": "sft",
            "env": ENV,
            "model": {"path": str(served)},
            "sft": {
                "data": "store",
                "store": {"db": url, "filters": {"tags": ["gateway"]}},
                "trainer": asdict(DEMO_RUN.sft.trainer),
            },
            "rollout": {"max_steps": 1, "full_schemas": False, "domain_policy": False},
            "evaluation": {"tasks": 1, "max_new_tokens": 4},  # its own report: one reply; ours follows
        }
    )
    train_sft(config)
    records = [orjson.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_bytes().splitlines()]
    (kept,) = [r for r in records if r["stage"] == "captured"]
    assert (kept["kept"], kept["dropped"]) == (ENV["train"], 0)
    # serve both back: the same held-out tickets, the same agent, greedy answers
    held_out = env.tasks(Split.TEST)
    scores = {}
    for label, folder in (("untrained", served), ("trained", tmp_path / "run" / "sft_policy")):
        outcomes = solved(desk, HFPolicy.load(folder, GREEDY), held_out, tmp_path / f"{label}.db")
        scores[label] = sum(outcomes)
    print(f"held-out tickets solved, of {len(held_out)}: {scores}")
    assert scores["trained"] >= scores["untrained"] + MARGIN
