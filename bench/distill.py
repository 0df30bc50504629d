"""Trace distillation: imitation on raw demonstrations against imitation on their distilled paths, at the
same token budget, on orders.

Raw demonstrations are noisy expert sessions on the demo's 400 imitation tickets: the expert's plan with
redundant lookups added (the stock check or the return check made again, at random), run with transient
tool faults that the expert calls again after, so a raw session holds failed calls, retries and redundant
steps. Distillation (`research.distill`) cuts each to its shortest path that still reads every
value its calls and answer read from the conversation and still verifies by replay.

Two copies of the demo's tiny model (`sessionrl.train.llm.demo.demo_config`: same shape, tokenizer and
initial weights) are trained by the demo's imitation recipe (lr 5e-3, warm-up and half-cosine, batches
of 8 sessions), one on each set, until each has seen the same number of training tokens (prompt and action
tokens of its packed sequences): what `--raw-steps` steps on the raw set take (by default 120, about two
thirds of the tokens of the demo's 240 steps on its clean demonstrations, so both arms fit on 2 crowded
cores in under an hour), so the distilled arm, with shorter sequences, takes more steps. Both are then
evaluated greedily on the demo's held-out test tickets with its evaluation faults (seeded by the ticket) and
compared task by task (exact McNemar p, bootstrap 95% interval). SPT counts tool and LLM calls per episode.

Last line: one JSON object with `raw_success`, `distilled_success`, `raw_spt`, `distilled_spt`, the
paired comparison, the demonstrations' step savings, the steps and tokens each arm took, and `minutes`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import math
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import torch

from research.distill import distill, savings
from sessionrl.envs.base import DecisionEnv, ExpertPlan, Split, Task, stream_seed
from sessionrl.envs.faults import Faults
from sessionrl.episodes import EpisodeSpec, ScriptedAgent, run_episodes
from sessionrl.episodes.llm import PolicyAgent, prompt_messages
from sessionrl.eval.metrics import compute
from sessionrl.eval.significance import paired_comparison
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.tiny import build_tiny_policy
from sessionrl.session import Session
from sessionrl.store import SessionStore
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.data import TokenSequence, demonstration_turns, merge_turns
from sessionrl.train.llm.demo import demo_config
from sessionrl.train.llm.reflection import success_by_task
from sessionrl.train.llm.run import split_digits, tokenizer_corpus
from sessionrl.train.llm.sft import SFTConfig, SFTTrainer

LOOKUPS = ("inventory_check", "return_check")
RECORD_STEPS = 12
"""Step limit of the raw recordings: room for the redundant lookups and the retries (evaluation keeps the
demo's 7)."""


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


def raw_demonstrations(env: DecisionEnv, config: RunConfig, fault_rate: float) -> list[Session]:
    """Solved noisy expert sessions on the demo's imitation tasks, with transient faults."""
    store = SessionStore.open("sqlite://")
    rollout = dataclasses.replace(config.rollout, max_steps=RECORD_STEPS, expert_retries=3)
    tasks = env.tasks(Split.TRAIN)[: config.sft.demos]
    faults = Faults(tool_error=fault_rate)
    specs = [
        EpisodeSpec(t, f"raw-{t.task_id}", seed=stream_seed("raw", t.task_id), faults=faults) for t in tasks
    ]
    agent = ScriptedAgent("noisy", lambda task: noisy_plan(env, task))
    ran = asyncio.run(run_episodes(env, specs, agent, store, rollout))
    return [store.get(r.session_id) for r in ran if r.success]


def sequences(
    sessions: Sequence[Session], system: str, policy: HFPolicy, max_chars: int
) -> list[TokenSequence]:
    """The sessions as imitation sequences."""
    return [
        seq
        for s in sessions
        for seq in merge_turns(demonstration_turns(s, system, policy, max_chars), s.session_id)
    ]


def train_to_budget(
    policy: HFPolicy, data: Sequence[TokenSequence], budget: int, recipe: SFTConfig
) -> dict[str, int]:
    """The demo's imitation recipe on batches of `data` until `budget` tokens were trained on (its cosine
    schedule spans the steps that takes on average); the steps and tokens taken."""
    mean = sum(len(s) for s in data) / len(data)
    planned = max(1, math.ceil(budget / (recipe.batch_sessions * mean)))
    trainer = SFTTrainer(
        policy.model, dataclasses.replace(recipe, steps=planned), policy.tokenizer.pad_token_id
    )
    seen = steps = 0
    while seen < budget:
        rng = random.Random(stream_seed(0, "sft", steps))
        chosen = rng.sample(list(data), min(recipe.batch_sessions, len(data)))
        trainer.step(chosen)
        seen += sum(len(s) for s in chosen)
        steps += 1
    return {"steps": steps, "planned_steps": planned, "tokens": seen}


def evaluate(env: DecisionEnv, policy: HFPolicy, config: RunConfig, n: int, label: str) -> list[Session]:
    """Greedy episodes on the first `n` test tasks with the demo's evaluation faults, seeded by the task."""
    store = SessionStore.open("sqlite://")
    faults = Faults(tool_error=config.faults.eval_rate)
    tasks = env.tasks(Split.TEST)[:n]
    specs = [
        EpisodeSpec(t, f"{label}-{t.task_id}", seed=stream_seed("eval", t.task_id), faults=faults)
        for t in tasks
    ]
    greedy = copy.copy(policy)
    greedy.sampling = SamplingConfig(max_new_tokens=64, temperature=0.0)
    ran = asyncio.run(run_episodes(env, specs, PolicyAgent(greedy, 0), store, config.rollout))
    return [store.get(r.session_id) for r in ran]


def figures(
    results: dict[str, Any], evaluated: dict[str, list[Session]], saved: dict[str, Any]
) -> dict[str, Any]:
    """Both arms' figures, their paired comparison (printed), and the demonstrations' savings."""
    c = paired_comparison(success_by_task(evaluated["raw"]), success_by_task(evaluated["distilled"]))
    print(
        f"raw -> distilled: {c.first_rate:.3f} -> {c.second_rate:.3f} on {c.tasks} tasks, raw alone "
        f"{c.first_only}, distilled alone {c.second_only}, McNemar p = {c.p_value:.3g}"
    )
    summary = {
        "raw_success": results["raw"]["success"],
        "distilled_success": results["distilled"]["success"],
        "raw_spt": results["raw"]["spt"],
        "distilled_spt": results["distilled"]["spt"],
        "raw_tcsr": results["raw"]["tcsr"],
        "distilled_tcsr": results["distilled"]["tcsr"],
        "p_success": round(c.p_value, 6),
        "success_ci": c.delta.as_list(),
        "raw_steps": results["raw"]["steps"],
        "distilled_steps": results["distilled"]["steps"],
        "raw_tokens": results["raw"]["tokens"],
        "distilled_tokens": results["distilled"]["tokens"],
        "demo_calls_before": saved["calls_before"],
        "demo_calls_after": saved["calls_after"],
        "demo_saved_share": round(saved["saved_share"], 4),
        "unverified": saved["unverified"],
    }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--raw-steps", type=int, default=120, help="the budget: these raw steps' tokens (the demo takes 240)"
    )
    parser.add_argument("--eval-tasks", type=int, default=100, help="the demo's held-out test tasks")
    parser.add_argument("--fault-rate", type=float, default=0.15, help="transient faults in the raw demos")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one on crowded cores)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.monotonic()
    config = demo_config(Path("unused"))
    env, recipe, chars = config.env.build(), config.sft.trainer, config.rollout.max_tool_chars
    raw = raw_demonstrations(env, config, args.fault_rate)
    distilled = distill(env, raw)
    saved = savings(distilled)
    print(f"demonstrations: {len(raw)} solved raw sessions; distillation: {saved}")
    system = prompt_messages(env, env.tasks(Split.TRAIN)[0], config.rollout)[0].content
    with tempfile.TemporaryDirectory() as folder:
        model, tokenizer = build_tiny_policy(
            tokenizer_corpus(env, system, raw, chars), config.model.tiny, Path(folder)
        )
        split_digits(tokenizer)
    arms = {"raw": raw, "distilled": [d.session for d in distilled]}
    data = {
        arm: sequences(sessions, system, HFPolicy(model, tokenizer), chars) for arm, sessions in arms.items()
    }
    budget = round(args.raw_steps * recipe.batch_sessions * sum(map(len, data["raw"])) / len(data["raw"]))
    results: dict[str, Any] = {}
    evaluated: dict[str, list[Session]] = {}
    for arm in arms:
        policy = HFPolicy(copy.deepcopy(model), tokenizer, SamplingConfig(max_new_tokens=64))
        took = train_to_budget(policy, data[arm], budget, recipe)
        evaluated[arm] = evaluate(env, policy, config, args.eval_tasks, arm)
        metrics = compute(evaluated[arm])
        results[arm] = {**took, "success": metrics.success, "spt": metrics.spt, "tcsr": metrics.tcsr}
        print(f"{arm}: {len(data[arm])} sequences, {took} -> {results[arm]}", flush=True)
    summary = figures(results, evaluated, saved)
    summary |= {"eval_tasks": args.eval_tasks, "token_budget": budget}
    summary["minutes"] = round((time.monotonic() - started) / 60, 2)
    print(orjson.dumps(summary).decode())


if __name__ == "__main__":
    main()
