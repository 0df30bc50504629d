"""DPO with counterfactual hard negatives against DPO with random negatives, on orders.

The base is the demo's imitation policy (`sessionrl.train.llm.demo.demo_config`: its tiny model, 240 steps
on 400 expert sessions), trained here or read from `--sft-policy` (the `sft_policy/` of a run of the
demo's recipe, such as `bench/reflection.py`'s). It plays `--pair-tasks` training tasks it never imitated
(no faults, so every failure is its own); each failed episode gives one pair at its failing step
(`research.negatives`): the best replayed alternative as chosen, and as rejected either the worst
replayed alternative (counterfactual) or a random action of another task (random). Both pair sets share
prompts and chosen replies. Two copies of the imitation policy are trained by DPO, one per set, with the
same settings, then all three are evaluated greedily on the same held-out test tasks with the demo's
evaluation faults (seeded by the task) and compared task by task (exact McNemar p, bootstrap 95% interval).

Last line: one JSON object with `random_success`, `counterfactual_success`, `sft_success`, the paired
comparisons' p-values and intervals, `pairs`, `rejected_kinds`, `failures` and `minutes`.
"""

from __future__ import annotations

import argparse
import random
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import torch
from rich.console import Console

from research.negatives import counterfactual_pair, random_pair
from sessionrl.envs.base import Split, Task
from sessionrl.episodes.verdict import task_success
from sessionrl.eval.significance import paired_comparison
from sessionrl.policy.llm import HFPolicy
from sessionrl.session import Session
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.demo import demo_config
from sessionrl.train.llm.dpo import DPOConfig, DPOTrainer, Preference
from sessionrl.train.llm.evaluation import Evaluation, evaluate, in_lockstep, once_per_task
from sessionrl.train.llm.loop import imitation, start_run
from sessionrl.train.llm.reflection import success_by_task
from sessionrl.train.llm.run import Run, evaluation_view, open_run


def imitation_policy(config: RunConfig, given: Path | None, console: Console) -> Path:
    """The folder of the imitation policy: `given`, or the demo's imitation stage run now."""
    if given is not None:
        return given
    with start_run(config, resume=False) as run:
        imitation(run, console, resume=False)
    return config.run_dir / "sft_policy"


def play(run: Run, policy: HFPolicy, tasks: Sequence[Task], label: str) -> list[Session]:
    """One greedy episode per task without faults, seeded by the task."""
    cfg = run.config
    view = evaluation_view(policy, cfg.evaluation.max_new_tokens)
    specs = once_per_task(cfg.seed, tasks, label, label, cfg.faults.fixed(0.0), {"stage": "negatives"})
    return [run.store.get(r.session_id) for r in in_lockstep(run, specs, view)]


def pairs_of(run: Run, failed: Sequence[Session]) -> tuple[list[Preference], list[Preference], Counter[str]]:
    """Counterfactual and random pairs at each failure's failing step; the kinds of the rejected ones."""
    tasks = {t.task_id: t for t in run.env.tasks(Split.TRAIN)}
    rng, hard, easy, kinds = random.Random(0), [], [], Counter[str]()
    for session in failed:
        task = tasks[str(session.metadata["task_id"])]
        found = counterfactual_pair(run.env, task, session, run.system, run.config.rollout.max_tool_chars)
        if found is not None:
            pair, ranked = found
            hard.append(pair)
            easy.append(random_pair(pair, run.env, rng))
            kinds[ranked[-1].kind] += 1
    return hard, easy, kinds


def compared(results: dict[str, Evaluation], console: Console) -> dict[str, Any]:
    """Each arm's success and SPT, and the arms compared task by task (printed, and as figures)."""
    summary: dict[str, Any] = {f"{k}_success": e.metrics.success for k, e in results.items()}
    summary |= {f"{k}_spt": e.metrics.spt for k, e in results.items()}
    for first, second in (("sft", "random"), ("sft", "counterfactual"), ("random", "counterfactual")):
        c = paired_comparison(
            success_by_task(results[first].sessions), success_by_task(results[second].sessions)
        )
        console.print(
            f"{first} -> {second}: {c.first_rate:.3f} -> {c.second_rate:.3f}, {first} alone "
            f"{c.first_only}, {second} alone {c.second_only}, McNemar p = {c.p_value:.3g}"
        )
        summary |= {
            f"{second}_vs_{first}_p": round(c.p_value, 6),
            f"{second}_vs_{first}_ci": c.delta.as_list(),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs/bench-negatives"))
    parser.add_argument(
        "--sft-policy", type=Path, default=None, help="an imitation policy of the demo's recipe"
    )
    parser.add_argument("--pair-tasks", type=int, default=200)
    parser.add_argument("--dpo-steps", type=int, default=25)
    parser.add_argument("--dpo-lr", type=float, default=1e-4, help="5e-4 wrecked the policy")
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--eval-tasks", type=int, default=100, help="the demo's held-out test tasks")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one on crowded cores)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started, console = time.monotonic(), Console()
    shutil.rmtree(args.run_dir, ignore_errors=True)
    config = demo_config(args.run_dir, eval_tasks=args.eval_tasks)
    folder = imitation_policy(config, args.sft_policy, console)
    with open_run(config) as run:
        run.policy = policy = HFPolicy.load(folder, config.rl.sampling, config.batching)
        unseen = run.env.tasks(Split.TRAIN)[config.sft.demos :][: args.pair_tasks]
        tried = play(run, policy, unseen, "try")
        failed = [s for s in tried if task_success(s) is False]
        hard, easy, kinds = pairs_of(run, failed)
        console.print(
            f"{len(failed)} failures of {len(tried)} episodes; {len(hard)} pairs; rejected: {dict(kinds)}"
        )
        results = {"sft": evaluate(run, policy, Split.TEST, args.eval_tasks, "sft")}
        dpo = DPOConfig(beta=args.beta, lr=args.dpo_lr, steps=args.dpo_steps, batch_size=8)
        for name, pairs in (("random", easy), ("counterfactual", hard)):
            student = HFPolicy.load(folder, config.rl.sampling, config.batching)
            logs = DPOTrainer(student, dpo).fit(pairs)
            results[name] = evaluate(run, student, Split.TEST, args.eval_tasks, name)
            console.print(
                f"{name}: DPO loss {logs[-1].loss:.3f}, pair accuracy {logs[-1].accuracy:.2f}; "
                f"success {results[name].metrics.success:.3f}"
            )
    summary = compared(results, console)
    summary |= {
        "pairs": len(hard),
        "rejected_kinds": dict(sorted(kinds.items())),
        "failures": len(failed),
        "tried": len(tried),
        "eval_tasks": args.eval_tasks,
        "minutes": round((time.monotonic() - started) / 60, 2),
    }
    print(orjson.dumps(summary).decode())


if __name__ == "__main__":
    main()
