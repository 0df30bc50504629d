"""Benchmark of the capture round trip on task success: captured sessions, `sessionrl train` (SFT on
`data: store`), and the trained policy against the untrained one on held-out tasks, through the gateway.

Tickets of every kind of the orders domain are captured. The example agent
(`examples/agents/openai_agent.py`, no system prompt) sends the ticket and runs the domain's tools on its
side. While sessions are captured, the gateway's own-policy backend answers as the expert would
(`gateway_demo.ExpertPolicy`), in the served tiny policy's tokens and action language, with values the
conversation holds written as references (``{{user.order}}``), as the demo's demonstrations write them;
the gateway resolves them before the agent sees them. So the captured sessions carry the token ids of the
model that training then updates, which has the demo's shape and SFT recipe
(`sessionrl.train.llm.demo.demo_config`). Held-out tickets (the test split's, never captured) are
answered greedily by both policies through the same gateway and agent, and the environment's judge says
which were solved. `tests/capture/test_round_trip.py` runs the same pipeline on fewer held-out tickets.

The last line is one JSON object: the solved counts of each policy, McNemar's p of the paired difference,
the final SFT loss, and the seconds each phase took.

    python bench/round_trip.py --captured 160 --steps 240 --held-out 50
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

from sessionrl.envs.base import Split, Task
from sessionrl.envs.registry import build
from sessionrl.eval.significance import mcnemar_p
from sessionrl.gateway import PolicyChat
from sessionrl.orchestrator.policy import PolicyBackend
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.demo import demo_config
from sessionrl.train.llm.loop import train_sft
from sessionrl.train.llm.run import split_digits

AGENTS = Path(__file__).resolve().parents[1] / "examples" / "agents"
GREEDY = SamplingConfig(max_new_tokens=64, temperature=0)
WRITER = "bench-writer"


sys.path.insert(0, str(AGENTS))  # the example agents are scripts beside each other, not a package
import gateway_demo as DEMO  # noqa: E402
import openai_agent as AGENT  # noqa: E402


def served_policy(desk: Any, model: TinyModelConfig, folder: Path) -> Path:
    """A tiny policy whose tokenizer knows the desk's texts (`OrdersDesk.corpus`)."""
    _, tokenizer = build_tiny_policy(desk.corpus(), model, folder)
    split_digits(tokenizer)
    tokenizer.save_pretrained(folder)
    return folder


def solved(desk: Any, tasks: Sequence[Task], policy: PolicyBackend, db: Path, max_turns: int) -> list[bool]:
    """Whether the example agent solved each task with `policy` behind the gateway (over a store at `db`),
    as the environment's judge says."""
    config = ServiceConfig(db_url=f"sqlite:///{db}", tokens=parse_tokens(f"{WRITER}:read,write"))
    app = create_app(config, skills=[], chat=PolicyChat([policy]))
    outcomes = []
    with DEMO.serving(app) as root, httpx.Client(timeout=300) as http:
        for task in tasks:
            episode, call_tool = desk.episode(task)
            url = f"{root}/gateway/sessions/{task.task_id}/v1"
            client = OpenAI(base_url=url, api_key=WRITER, http_client=http, max_retries=0)
            final = AGENT.run_agent(client, task.instruction, desk.tools, call_tool, max_turns=max_turns)
            outcomes.append(bool(episode.success([final])))
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
            "rollout": {"max_steps": 1, "full_schemas": False, "domain_policy": False},
            "evaluation": {"tasks": 1, "max_new_tokens": 4},  # its own report: one reply; ours follows
        }
    )


def round_trip(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Capture, train, and serve both policies back; the figures of the JSON line."""
    demo = demo_config(seed=args.seed)
    env = build("orders", seed=args.seed, train=args.captured, dev=1, test=args.held_out)
    desk = DEMO.OrdersDesk(n_tasks=args.captured, split=Split.TRAIN, env=env)
    held_out = env.tasks(Split.TEST)
    began = time.perf_counter()
    served = served_policy(desk, demo.model.tiny, tmp / "served")
    teacher = DEMO.ExpertPolicy(desk, HFPolicy.load(served, GREEDY))
    taught = sum(solved(desk, desk.tasks, teacher, tmp / "captured.db", args.max_turns))
    captured_s = time.perf_counter() - began
    print(f"captured {args.captured} sessions ({taught} solved) in {captured_s:.0f} s", flush=True)
    train_sft(run_config(tmp / "run", served, f"sqlite:///{tmp / 'captured.db'}", args))
    trained_s = time.perf_counter() - began - captured_s
    records = [orjson.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_bytes().splitlines()]
    losses = [r["loss"] for r in records if r["stage"] == "sft" and "loss" in r]
    outcomes = {
        label: solved(desk, held_out, HFPolicy.load(folder, GREEDY), tmp / f"{label}.db", args.max_turns)
        for label, folder in (("untrained", served), ("trained", tmp / "run" / "sft_policy"))
    }
    pairs = list(zip(outcomes["untrained"], outcomes["trained"], strict=True))
    return {
        "captured": args.captured,
        "held_out": len(held_out),
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
    recipe = demo_config().sft.trainer
    parser.add_argument("--captured", type=int, default=160, help="Training tickets captured.")
    parser.add_argument("--held-out", type=int, default=50, help="Held-out test tickets answered.")
    parser.add_argument("--steps", type=int, default=recipe.steps, help="SFT steps.")
    parser.add_argument("--batch", type=int, default=recipe.batch_sessions, help="Sessions per SFT step.")
    parser.add_argument("--lr", type=float, default=recipe.lr, help="SFT learning rate.")
    parser.add_argument("--max-turns", type=int, default=8, help="Model calls the agent makes at most.")
    parser.add_argument("--seed", type=int, default=0, help="Seeds the tasks, the model and the batches.")
    parser.add_argument("--threads", type=int, default=1, help="Torch threads (one on crowded cores).")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(round_trip(args, Path(tmp))))


if __name__ == "__main__":
    main()
