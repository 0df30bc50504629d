"""Benchmark of the capture round trip on task success: captured sessions, `sessionrl train` (SFT on
`data: store`), and the trained policy against the untrained one on held-out tasks, through the gateway.

The tasks are orders' stock inquiries: one tool call (`inventory_check` of the ticket's SKU), then an
answer that states the SKU and its stock (units on hand, or the restock date). The example agent
(`examples/agents/openai_agent.py`) forwards the ticket's header line as the user message and runs the
domain's tools on its side. While sessions are captured, the gateway's own-policy backend answers as the
expert would, in the served tiny policy's tokens, so the captured sessions carry the token ids of the
model that training then updates; its answers state the two facts and nothing else (`SKU-1: 4 on
hand.`). Held-out tickets (the test split's, never captured) are answered greedily by both
policies through the same gateway and agent, and the environment's judge says which were solved.

Solving a held-out ticket needs the SKU copied from the ticket and the stock from the tool's answer,
which a tiny model learns only after some hundreds of SFT steps; the test suite's round trip
(`tests/capture/test_round_trip.py`) compares what a few seconds of training can move instead. The last
line is one JSON object: the solved counts of each policy, McNemar's p of the paired difference, and
the seconds each phase took.

    python bench/round_trip.py --steps 450
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import torch
from openai import OpenAI

from sessionrl.envs.base import DecisionEnv, Split, Task
from sessionrl.envs.orders import Ticket
from sessionrl.envs.registry import build
from sessionrl.eval.significance import mcnemar_p
from sessionrl.gateway import PolicyChat
from sessionrl.orchestrator.policy import PolicyBackend, PolicyReply
from sessionrl.policy.llm import HFPolicy, SamplingConfig, final_action, tool_action
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.session.model import Message
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.loop import train_sft
from sessionrl.train.llm.run import split_digits

AGENTS = Path(__file__).resolve().parents[1] / "examples" / "agents"
GREEDY = SamplingConfig(max_new_tokens=48, temperature=0)
WRITER = "bench-writer"


sys.path.insert(0, str(AGENTS))  # the example agents are scripts beside each other, not a package
import gateway_demo as DEMO  # noqa: E402
import openai_agent as AGENT  # noqa: E402


def stock_inquiries(env: DecisionEnv, split: Split, n: int) -> list[Task]:
    """The first `n` stock inquiries of `split`."""
    tasks = [t for t in env.tasks(split) if t.payload["issue"] == "stock_inquiry"][:n]
    if len(tasks) < n:
        raise SystemExit(f"{split.value} holds {len(tasks)} stock inquiries, not {n}")
    return tasks


def ticket_line(task: Task) -> str:
    """What the agent sends: the ticket's header line (category, item, phone)."""
    return task.instruction.splitlines()[-1]


def record_answer(task: Task) -> str:
    """The captured model's answer: the SKU and its stock, tersely."""
    ticket = Ticket.from_payload(task.payload)
    if ticket.on_hand:
        return f"{ticket.sku}: {ticket.on_hand} on hand."
    return f"{ticket.sku}: back on {ticket.restock_date()}."


class Teacher:
    """The captured model: the expert's call, then `record_answer`, in the served policy's tokens."""

    def __init__(self, env: DecisionEnv, tasks: Sequence[Task], served: HFPolicy) -> None:
        self.env, self.served = env, served
        self.tasks = {ticket_line(t): t for t in tasks}

    async def generate(self, messages: Sequence[Message], *, purpose: str) -> PolicyReply:
        task = self.tasks[next(m.content for m in messages if m.role == "user")]
        if any(m.role == "assistant" for m in messages):
            text = final_action(record_answer(task))
        else:
            (step,) = self.env.expert(task).steps
            text = tool_action(step.tool, dict(step.params))
        prompt = self.served.encode_prompt(messages)
        return PolicyReply(
            text=text, prompt_token_ids=tuple(prompt), token_ids=tuple(self.served.encode_reply(text))
        )


def served_policy(env: DecisionEnv, tasks: Sequence[Task], model: TinyModelConfig, folder: Path) -> Path:
    """A tiny policy whose tokenizer knows the domain's texts (the tickets and the captured answers)."""
    texts = [t.instruction for t in tasks]
    for task in tasks:
        (step,) = env.expert(task).steps
        texts += [tool_action(step.tool, dict(step.params)), final_action(record_answer(task))]
    _, tokenizer = build_tiny_policy(texts, model, folder)
    split_digits(tokenizer)
    tokenizer.save_pretrained(folder)
    return folder


def solved(env: DecisionEnv, tasks: Sequence[Task], policy: PolicyBackend, db: Path) -> list[bool]:
    """Whether the example agent solved each task with `policy` behind the gateway (over a store at `db`),
    as the environment's judge says."""
    desk = DEMO.OrdersDesk(n_tasks=0, env=env)
    config = ServiceConfig(db_url=f"sqlite:///{db}", tokens=parse_tokens(f"{WRITER}:read,write"))
    app = create_app(config, skills=[], chat=PolicyChat([policy]))
    outcomes = []
    with DEMO.serving(app) as root, httpx.Client(timeout=300) as http:
        for task in tasks:
            episode, call_tool = desk.episode(task)
            url = f"{root}/gateway/sessions/{task.task_id}/v1"
            client = OpenAI(base_url=url, api_key=WRITER, http_client=http, max_retries=0)
            final = AGENT.run_agent(client, ticket_line(task), desk.tools, call_tool, max_turns=2)
            outcomes.append(episode.success([final]))
    return outcomes


def run_config(folder: Path, served: Path, url: str, args: argparse.Namespace) -> RunConfig:
    """`sessionrl train`'s config: SFT on the captured sessions, the served policy as the start."""
    trainer = {"lr": args.lr, "steps": args.steps, "batch_sessions": args.batch, "token_budget": 8192}
    return RunConfig.model_validate(
        {
            "run_dir": str(folder),
            "seed": args.seed,
            "trainer": "sft",
            "env": {"train": 2, "dev": 1, "test": 1},
            "model": {"path": str(served)},
            "sft": {
                "data": "store",
                "store": {"db": url, "filters": {"tags": ["gateway"]}},
                "trainer": trainer,
            },
            "evaluation": {"tasks": 1, "max_new_tokens": 4},
        }
    )


def round_trip(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Capture, train, and serve both policies back; the figures of the JSON line."""
    model = TinyModelConfig(
        vocab_size=700,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        intermediate_size=2 * args.hidden,
        seed=args.seed,
    )
    env = build("orders", seed=args.seed, train=6 * args.captured, dev=1, test=6 * args.held_out)
    captured = stock_inquiries(env, Split.TRAIN, args.captured)
    held_out = stock_inquiries(env, Split.TEST, args.held_out)
    began = time.perf_counter()
    served = served_policy(env, captured, model, tmp / "served")
    teacher = Teacher(env, captured, HFPolicy.load(served, GREEDY))
    taught = sum(solved(env, captured, teacher, tmp / "captured.db"))
    captured_s = time.perf_counter() - began
    print(f"captured {args.captured} sessions ({taught} solved) in {captured_s:.0f} s", flush=True)
    train_sft(run_config(tmp / "run", served, f"sqlite:///{tmp / 'captured.db'}", args))
    trained_s = time.perf_counter() - began - captured_s
    records = [orjson.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_bytes().splitlines()]
    losses = [r["loss"] for r in records if r["stage"] == "sft" and "loss" in r]
    outcomes = {
        label: solved(env, held_out, HFPolicy.load(folder, GREEDY), tmp / f"{label}.db")
        for label, folder in (("untrained", served), ("trained", tmp / "run" / "sft_policy"))
    }
    pairs = list(zip(outcomes["untrained"], outcomes["trained"], strict=True))
    return {
        "captured": args.captured,
        "held_out": args.held_out,
        "steps": args.steps,
        "untrained": sum(outcomes["untrained"]),
        "trained": sum(outcomes["trained"]),
        "mcnemar_p": round(
            mcnemar_p(sum(u and not t for u, t in pairs), sum(t and not u for u, t in pairs)), 4
        ),
        "final_loss": round(losses[-1], 4) if losses else None,
        "capture_s": round(captured_s, 1),
        "train_s": round(trained_s, 1),
        "eval_s": round(time.perf_counter() - began - captured_s - trained_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captured", type=int, default=240, help="Stock inquiries captured (training).")
    parser.add_argument("--held-out", type=int, default=16, help="Held-out stock inquiries answered.")
    parser.add_argument("--steps", type=int, default=450, help="SFT steps.")
    parser.add_argument("--batch", type=int, default=16, help="Sessions per SFT step.")
    parser.add_argument("--lr", type=float, default=0.015, help="SFT learning rate.")
    parser.add_argument("--hidden", type=int, default=64, help="The tiny model's width.")
    parser.add_argument("--layers", type=int, default=2, help="The tiny model's blocks.")
    parser.add_argument("--heads", type=int, default=4, help="Attention heads per block.")
    parser.add_argument("--seed", type=int, default=0, help="Seeds the tasks, the model and the batches.")
    parser.add_argument("--threads", type=int, default=1, help="Torch threads (one on crowded cores).")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(round_trip(args, Path(tmp))))


if __name__ == "__main__":
    main()
