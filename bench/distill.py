"""Trace distillation: imitation on raw demonstrations against imitation on their distilled paths, at the
same token budget, on orders.

Raw demonstrations are noisy expert sessions: the expert's plan with redundant lookups added (the stock
check or the return check made again, at random), run with transient tool faults that the expert calls
again after, so a raw session holds failed calls, retries and redundant steps. Distillation
(`sessionrl.train.llm.distill`) cuts each to its shortest path that still verifies by replay.

Two copies of one tiny model (same tokenizer, same initial weights) are trained by SFT, one on each set,
until each has seen `--token-budget` training tokens (prompt and action tokens of its packed sequences),
then evaluated greedily on the same test tasks with the same faults. SPT counts tool and LLM calls per
episode.

Last line: one JSON object with `raw_success`, `distilled_success`, `raw_spt`, `distilled_spt`, the
demonstrations' step savings, the steps each arm took, and `minutes`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from sessionrl.envs import build
from sessionrl.envs.base import DecisionEnv, ExpertPlan, Split, Task, stream_seed
from sessionrl.envs.faults import Faults
from sessionrl.episodes import EpisodeSpec, RolloutConfig, ScriptedAgent, run_episodes
from sessionrl.episodes.llm import PolicyAgent, prompt_messages
from sessionrl.eval.metrics import compute
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.session import Session
from sessionrl.store import SessionStore
from sessionrl.train.llm.data import TokenSequence, demonstration_turns, merge_turns
from sessionrl.train.llm.distill import distill, savings
from sessionrl.train.llm.run import split_digits, tokenizer_corpus
from sessionrl.train.llm.sft import SFTConfig, SFTTrainer

ROLLOUT = RolloutConfig(
    max_steps=7, full_schemas=False, domain_policy=False, max_tool_chars=300, expert_retries=3
)
LOOKUPS = ("inventory_check", "return_check")


def noisy_plan(env: DecisionEnv, task: Task) -> ExpertPlan:
    """The expert's plan with each lookup step made once or twice more, at random (seeded by the task)."""
    plan = env.expert(task)
    rng = random.Random(stream_seed("noisy", task.task_id))
    steps = []
    for step in plan.steps:
        steps.append(step)
        if step.tool in LOOKUPS:
            steps += [dataclasses.replace(step, id=f"{step.id}r{i}") for i in range(rng.randrange(1, 3))]
    return dataclasses.replace(plan, steps=tuple(steps))


def raw_demonstrations(env: DecisionEnv, n: int, fault_rate: float) -> list[Session]:
    """Solved noisy expert sessions on the first `n` training tasks, with transient faults."""
    store = SessionStore.open("sqlite://")
    faults = Faults(tool_error=fault_rate)
    tasks = env.tasks(Split.TRAIN)[:n]
    specs = [
        EpisodeSpec(t, f"raw-{t.task_id}", seed=stream_seed("raw", t.task_id), faults=faults) for t in tasks
    ]
    agent = ScriptedAgent("noisy", lambda task: noisy_plan(env, task))
    ran = asyncio.run(run_episodes(env, specs, agent, store, ROLLOUT))
    return [store.get(r.session_id) for r in ran if r.success]


def sequences(sessions: Sequence[Session], system: str, policy: HFPolicy) -> list[TokenSequence]:
    """The sessions as imitation sequences."""
    return [
        seq
        for s in sessions
        for seq in merge_turns(demonstration_turns(s, system, policy, ROLLOUT.max_tool_chars), s.session_id)
    ]


def train_to_budget(
    policy: HFPolicy, data: Sequence[TokenSequence], budget: int, batch: int, seed: int
) -> int:
    """SFT on batches of `data` until `budget` tokens were trained on; returns the steps taken."""
    config = SFTConfig(lr=5e-3, steps=10_000, batch_sessions=batch, token_budget=8192, cosine=False)
    trainer = SFTTrainer(policy.model, config, policy.tokenizer.pad_token_id)
    seen = steps = 0
    while seen < budget:
        rng = random.Random(stream_seed(seed, "sft", steps))
        chosen = rng.sample(list(data), min(batch, len(data)))
        trainer.step(chosen)
        seen += sum(len(s) for s in chosen)
        steps += 1
    return steps


def evaluate(env: DecisionEnv, policy: HFPolicy, n: int, label: str, fault_rate: float) -> dict[str, Any]:
    """Greedy episodes on the first `n` test tasks; success and SPT."""
    store = SessionStore.open("sqlite://")
    faults = Faults(tool_error=fault_rate)
    tasks = env.tasks(Split.TEST)[:n]
    specs = [
        EpisodeSpec(t, f"{label}-{t.task_id}", seed=stream_seed("eval", t.task_id), faults=faults)
        for t in tasks
    ]
    greedy = copy.copy(policy)
    greedy.sampling = SamplingConfig(max_new_tokens=64, temperature=0.0)
    ran = asyncio.run(run_episodes(env, specs, PolicyAgent(greedy, 0), store, ROLLOUT))
    metrics = compute([store.get(r.session_id) for r in ran])
    return {"success": metrics.success, "spt": metrics.spt, "tcsr": metrics.tcsr}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demos", type=int, default=160)
    parser.add_argument("--token-budget", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--eval-tasks", type=int, default=30)
    parser.add_argument("--fault-rate", type=float, default=0.15)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    started = time.monotonic()
    env = build("orders", train=max(args.demos, 1), dev=1, test=args.eval_tasks, time_factor=0)
    raw = raw_demonstrations(env, args.demos, args.fault_rate)
    distilled = distill(env, raw)
    saved = savings(distilled)
    print(f"demonstrations: {len(raw)} solved raw sessions; distillation: {saved}")
    system = prompt_messages(env, env.tasks(Split.TRAIN)[0], ROLLOUT)[0].content
    shape = TinyModelConfig(
        vocab_size=1024,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=2,
        intermediate_size=4 * args.hidden_size,
    )
    with tempfile.TemporaryDirectory() as folder:
        model, tokenizer = build_tiny_policy(tokenizer_corpus(env, system, raw, 300), shape, Path(folder))
        split_digits(tokenizer)
    results: dict[str, Any] = {}
    for arm, sessions in (("raw", raw), ("distilled", [d.session for d in distilled])):
        policy = HFPolicy(copy.deepcopy(model), tokenizer, SamplingConfig(max_new_tokens=64))
        data = sequences(sessions, system, policy)
        steps = train_to_budget(policy, data, args.token_budget, args.batch, seed=0)
        results[arm] = {"steps": steps, **evaluate(env, policy, args.eval_tasks, arm, args.fault_rate)}
        print(f"{arm}: {len(data)} sequences, {steps} steps to {args.token_budget} tokens -> {results[arm]}")
    summary = {
        "raw_success": results["raw"]["success"],
        "distilled_success": results["distilled"]["success"],
        "raw_spt": results["raw"]["spt"],
        "distilled_spt": results["distilled"]["spt"],
        "raw_steps": results["raw"]["steps"],
        "distilled_steps": results["distilled"]["steps"],
        "demo_calls_before": saved["calls_before"],
        "demo_calls_after": saved["calls_after"],
        "demo_saved_share": round(saved["saved_share"], 4),
        "unverified": saved["unverified"],
        "eval_tasks": args.eval_tasks,
        "token_budget": args.token_budget,
        "minutes": round((time.monotonic() - started) / 60, 2),
    }
    print(orjson.dumps(summary).decode())


if __name__ == "__main__":
    main()
