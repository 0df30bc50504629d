"""Tool choice of the LLM policy with and without the tool-call head, on held-out orders and retail steps.

For each domain a tiny LM imitates the expert's sessions on training tasks (the run's own imitation stage,
`train.llm.imitation`), and the expert's sessions on test tasks give the held-out steps: each reply
the expert wrote there, labelled with the tool it called (or *final*). Then, on the held-out steps:

- **LM alone**: the share of steps whose greedy reply calls the expert's tool (a reply that is not an
  action counts as wrong), and the share of its replies that parse as an action at all;
- **head**: the share whose class the tool-call head picks (`policy.toolhead.ToolHead`, fit on the LM's
  states of the training steps, the LM frozen);
- **guided**: the share whose reply, generated with the head's choice imposed (`toolhead.HeadGuide`),
  calls the expert's tool, and the share of those replies that parse as an action at all.

Retail needs the τ-bench data (``--retail-data``, default ``../shared/taubench/retail``); without it only
orders runs. The last line is one JSON object: ``<domain>_lm_accuracy``, ``<domain>_lm_parsed``,
``<domain>_head_accuracy``, ``<domain>_guided_accuracy``, ``<domain>_guided_parsed`` and ``<domain>_steps``
(held-out steps).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import torch
from rich.console import Console
from rich.table import Table

from research.toolhead import HeadGuide, ToolHead, accuracy, fit_tool_head, prompt_states, reply_class
from sessionrl.envs.base import Split
from sessionrl.envs.faults import Faults
from sessionrl.episodes import expert, run_episodes
from sessionrl.policy.llm import HFPolicy
from sessionrl.session.model import Message, Session
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.data import demonstration_replies
from sessionrl.train.llm.evaluation import once_per_task
from sessionrl.train.llm.loop import imitation
from sessionrl.train.llm.run import Run, evaluation_view, open_run

CHUNK = 16
"""Prompts per forward pass."""


def config_for(domain: str, folder: Path, args: argparse.Namespace) -> RunConfig:
    """A small imitation run of `domain` in `folder`."""
    env: dict[str, Any] = {"name": domain}
    if domain == "orders":
        env |= {"train": args.demos, "dev": 0, "test": args.test}
    else:
        env |= {"data": str(args.retail_data)}
    return RunConfig.model_validate(
        {
            "run_dir": str(folder),
            "trainer": "sft",
            "env": env,
            "model": {
                "tiny": {
                    "vocab_size": 1024 if domain == "orders" else 3072,
                    "hidden_size": 64,
                    "num_layers": 2,
                    "num_heads": 2,
                    "intermediate_size": 256,
                }
            },
            "rollout": {
                "max_steps": 12,
                "full_schemas": False,
                "domain_policy": False,
                "max_tool_chars": 300,
            },
            "sft": {
                "demos": args.demos,
                "trainer": {"lr": 0.005, "steps": args.sft_steps, "batch_sessions": 16, "token_budget": 8192},
            },
        }
    )


def held_out(run: Run, count: int) -> list[Session]:
    """The expert's solved sessions on the first `count` test tasks (no faults)."""
    cfg = run.config
    tasks = run.env.tasks(Split.TEST)[:count]
    specs = once_per_task(cfg.seed, tasks, "heldout", "heldout", Faults(), {"stage": "heldout"})
    ran = asyncio.run(
        run_episodes(run.env, specs, expert(run.env), run.store, cfg.rollout, orchestrator=cfg.orchestrator)
    )
    return [run.store.get(r.session_id) for r in ran if r.success]


def steps_of(run: Run, sessions: Sequence[Session]) -> tuple[list[tuple[Message, ...]], list[str]]:
    """Every expert reply of `sessions` that is an action: the conversation it answers and its class."""
    policy = run.need_policy()
    conversations, labels = [], []
    for session in sessions:
        for reply in demonstration_replies(
            session, run.system, run.config.rollout.max_tool_chars, policy.tool_format
        ):
            label = reply_class(reply.text)
            if label is not None:
                conversations.append(reply.messages)
                labels.append(label)
    return conversations, labels


def states_of(policy: HFPolicy, conversations: Sequence[Sequence[Message]]) -> torch.Tensor:
    """``[N, H]`` LM states at the end of each conversation's prompt."""
    prompts = [policy.encode_prompt(c) for c in conversations]
    return torch.cat([prompt_states(policy, prompts[i : i + CHUNK]) for i in range(0, len(prompts), CHUNK)])


def replies(policy: HFPolicy, conversations: Sequence[Sequence[Message]]) -> list[str]:
    """Greedy replies to `conversations`, in batches."""
    texts: list[str] = []
    for i in range(0, len(conversations), CHUNK):
        texts += [r.text for r in policy.generate_now(conversations[i : i + CHUNK])]
    return texts


def parses(text: str) -> bool:
    """Whether a reply is one JSON object."""
    try:
        return isinstance(orjson.loads(text), dict)
    except orjson.JSONDecodeError:
        return False


def measure(domain: str, args: argparse.Namespace, console: Console) -> dict[str, float]:
    """Imitate, fit the head, and score the three ways of choosing on held-out steps."""
    with tempfile.TemporaryDirectory() as folder, open_run(config_for(domain, Path(folder), args)) as run:
        started = time.perf_counter()
        demos = imitation(run, console, resume=False)
        policy = evaluation_view(run.need_policy(), args.max_new_tokens)
        train_steps, train_labels = steps_of(run, demos)
        test_steps, test_labels = steps_of(run, held_out(run, args.test))
        head = ToolHead(int(policy.model.config.hidden_size), sorted(c.name for c in run.env.contracts()))
        fit_tool_head(head, states_of(policy, train_steps), train_labels, epochs=args.head_epochs)
        plain_texts = replies(policy, test_steps)
        plain = [reply_class(text) for text in plain_texts]
        chosen = HeadGuide(policy, head).choose([policy.encode_prompt(c) for c in test_steps])
        guided_view = evaluation_view(policy, args.max_new_tokens)
        guided_view.guide = HeadGuide(guided_view, head)
        guided_texts = replies(guided_view, test_steps)
        console.print(
            f"{domain}: {len(demos)} demos, {len(train_steps)} training steps, {len(test_steps)} held-out "
            f"steps, {time.perf_counter() - started:.0f} s"
        )
        return {
            "lm_accuracy": accuracy(plain, test_labels),
            "lm_parsed": sum(parses(t) for t in plain_texts) / len(plain_texts),
            "head_accuracy": accuracy(chosen, test_labels),
            "guided_accuracy": accuracy([reply_class(t) for t in guided_texts], test_labels),
            "guided_parsed": sum(parses(t) for t in guided_texts) / len(guided_texts),
            "steps": float(len(test_steps)),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demos", type=int, default=60, help="training tasks the LM imitates")
    parser.add_argument("--test", type=int, default=30, help="test tasks whose expert steps are held out")
    parser.add_argument("--sft-steps", type=int, default=120, help="imitation optimiser steps")
    parser.add_argument("--head-epochs", type=int, default=300, help="full-batch steps fitting the head")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="reply length limit")
    parser.add_argument("--retail-data", type=Path, default=Path("../shared/taubench/retail"))
    args = parser.parse_args()
    torch.manual_seed(0)
    console = Console(width=120)
    domains = ["orders"] + (["retail"] if (args.retail_data / "tasks_test.json").exists() else [])
    if len(domains) == 1:
        console.print(f"no τ-bench retail data at {args.retail_data}: orders only")
    table = Table(title="tool choice on held-out expert steps")
    for column in ("domain", "steps", "LM alone", "LM parses", "head", "guided", "guided parses"):
        table.add_column(column, justify="right")
    summary: dict[str, float] = {}
    for domain in domains:
        scores = measure(domain, args, console)
        console.print(f"{domain}: " + ", ".join(f"{key} {value:.3f}" for key, value in scores.items()))
        table.add_row(
            domain,
            f"{scores['steps']:.0f}",
            *(
                f"{scores[k]:.3f}"
                for k in ("lm_accuracy", "lm_parsed", "head_accuracy", "guided_accuracy", "guided_parsed")
            ),
        )
        summary |= {f"{domain}_{key}": round(value, 4) for key, value in scores.items()}
    console.print(table)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
