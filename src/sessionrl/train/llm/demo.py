"""The main job, `sessionrl demo`: a tiny policy learns the orders domain by imitation, then by RL.

What it does, in a few minutes on two CPU cores, all under `runs/demo/`:

1. records expert episodes on 400 training tickets (through the orchestrator, into the store);
2. builds a tiny chat model whose tokenizer is trained on the domain's own texts;
3. imitates the experts for a deliberately small number of steps, so the imitation policy is competent
   but rough: it copies ids and amounts wrongly now and then, and it saw few tool failures (the
   demonstrations meet transient faults at 5%, and the expert calls again after one);
4. runs two rounds of rejection sampling on the other 400 training tickets (none of them imitated), with
   transient tool faults at 15%: each round samples K = 4 episodes of each of 64 tickets at temperature
   0.6, keeps the solved ones in which no reward term (`demo_rewards.yaml`) charged a step, and imitates
   them in small steps, half of each batch replayed from the demonstrations; 100 dev tickets judge each
   round, and one after which the policy solves fewer of them is undone. GRPO can follow
   (`--rl-iterations N`): K episodes per ticket, the task's outcome ranking the group, a failed call the
   policy caused or a reply that is not an action charged to the reply that made it, a call again after an
   outage credited to it; it raises only the replies that beat their group or earned a recovery credit
   (`negative_weight=0`), in small steps, since plain GRPO, pushing down every token of the rough
   policy's many failed episodes, unlearned the imitation within a dozen iterations;
5. evaluates the imitation policy and the RL policy greedily on the same held-out test tickets, with the
   same faults, and prints the learning curve, the metrics table, the paired comparison (exact McNemar
   p for success; bootstrap 95% intervals for the change in success and in TCSR, tasks resampled in
   pairs) and one JSON line.

GRPO runs a fixed number of iterations (`RL_ITERATIONS`), not a wall-clock budget, so a seed gives the
same run on a fast machine and a slow one.

Nothing is tuned on the test tickets: the learning curve is on training tickets, the rounds are judged on
dev tickets, the report is on the first `eval_tasks` test tickets, and both policies meet the same faults
there (their seeds follow the ticket).

The system prompt here leaves out the domain's policy text and the full tool schemas (it keeps the
action format and the tool signatures): a tiny model cannot read rules, and its context is the CPU cost.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from sessionrl.envs.base import Split
from sessionrl.envs.faults import FaultSchedule
from sessionrl.episodes import RolloutConfig
from sessionrl.episodes.verdict import task_success
from sessionrl.eval.report import metrics_table
from sessionrl.eval.significance import Interval, PairedComparison, paired_comparison, paired_ratio_diff_ci
from sessionrl.eval.tool_accuracy import describe, paired_counts, pooled_change
from sessionrl.policy.llm import BatchingConfig, SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig
from sessionrl.rewards.engine import RewardConfig
from sessionrl.session.model import CallStatus, Session
from sessionrl.skills import ExecutorConfig
from sessionrl.train.config import (
    EnvSection,
    EvalSection,
    FaultSection,
    ModelSection,
    RFTSection,
    RLSection,
    RunConfig,
    SFTSection,
)
from sessionrl.train.llm.evaluation import Evaluation
from sessionrl.train.llm.grpo import GRPOConfig
from sessionrl.train.llm.loop import train
from sessionrl.train.llm.sft import SFTConfig
from sessionrl.train.llm.view import curve_table

REWARD_RULES = Path(__file__).with_name("demo_rewards.yaml")
"""Outcome for the group ranking; the policy's own failed calls charged to the replies that made them."""

FAULTS = 0.15
"""Chance that a tool call fails transiently (`UNAVAILABLE`), in RL and in evaluation."""

DEMO_FAULTS = 0.05
"""The same chance in the expert demonstrations: imitation sees a few recoveries, RL three times more."""

RL_ITERATIONS = 0
"""GRPO iterations after rejection sampling: a budget in iterations, not minutes, so a seed gives the
same run on any machine. None by default: on dev, the demo's GRPO moved success by a task or two either
way (docs/training.md); `--rl-iterations 12` adds the GRPO stage the demo ran before."""

GRPO_ITERATIONS = 12
"""The GRPO stage's length where a bench runs it on the demo's recipe (late feedback, reflection)."""

RFT_ROUNDS = 2
"""Rounds of rejection sampling after the gate (each: sample, keep the clean solved episodes, imitate)."""

DEV_TASKS = 100
"""Dev tasks that judge each round of rejection sampling: a round that solves fewer is undone."""


def demo_config(
    run_dir: Path = Path("runs/demo"),
    *,
    seed: int = 0,
    sft_steps: int = 240,
    sft_batch: int = 8,
    rl_iterations: int = RL_ITERATIONS,
    rft_rounds: int = RFT_ROUNDS,
    temperature: float = 0.6,
    eval_tasks: int = 100,
) -> RunConfig:
    """The demo's run: tiny model, small imitation budget, `rl_iterations` of GRPO, held-out evaluation.

    `seed` seeds everything the run draws (the model's initialisation, demonstration and RL faults, task
    samples, batches, sampling); the tasks themselves, and so the held-out test tasks, stay the same.
    """
    tiny = TinyModelConfig(
        vocab_size=1024, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512, seed=seed
    )
    executor = ExecutorConfig(max_attempts=1)  # transient failures reach the policy, which must retry
    return RunConfig(
        run_dir=run_dir,
        seed=seed,
        env=EnvSection(name="orders", options={"train": 800, "dev": DEV_TASKS, "test": 100}),
        model=ModelSection(tiny=tiny),
        rollout=RolloutConfig(
            max_steps=7, full_schemas=False, domain_policy=False, max_tool_chars=300, executor=executor
        ),
        batching=BatchingConfig(max_batch=64, gather_ms=20.0),
        faults=FaultSection(
            schedule=FaultSchedule(start=FAULTS, end=FAULTS, steps=1),
            eval_rate=FAULTS,
            demo_rate=DEMO_FAULTS,
            garbled=False,
        ),
        sft=SFTSection(
            demos=400,
            trainer=SFTConfig(lr=5e-3, steps=sft_steps, batch_sessions=sft_batch, token_budget=8192),
        ),
        rl=RLSection(
            iterations=rl_iterations,
            tasks_per_iteration=8,
            unseen_tasks=True,
            max_lag=2,
            sampling=SamplingConfig(
                max_new_tokens=64, temperature=temperature, max_prompt_tokens=1536, seed=seed
            ),
            trainer=GRPOConfig(
                lr=1e-4,
                group_size=4,
                clip_eps=0.2,
                epochs=2,
                reward="layer:long_term",
                step_coef=0.5,
                negative_weight=0.0,
                temperature=temperature,
                token_budget=8192,
            ),
        ),
        rft=rejection_sampling(rft_rounds, temperature, seed),
        evaluation=EvalSection(split=Split.TEST, tasks=eval_tasks, gate_tasks=10, max_new_tokens=64),
        rewards=RewardConfig(rules=REWARD_RULES),
    )


def rejection_sampling(rounds: int, temperature: float, seed: int) -> RFTSection | None:
    """The demo's warm start before GRPO (none at 0 rounds): each round samples 4 episodes of each of 64
    training tasks, keeps the clean solved ones (`accept: clean`), imitates them for 40 small steps with
    half of each batch replayed from the demonstrations (`replay`: on 100 dev tasks, at two threads and
    five seeds, it kept per-turn tool accuracy at imitation's, 0.742 against 0.705 without, and solved 142
    tasks against 141; docs/training.md), and stays only if the policy then solves at least as many of the
    `DEV_TASKS` dev tasks as before it."""
    if rounds == 0:
        return None
    return RFTSection(
        rounds=rounds,
        tasks=64,
        samples=4,
        accept="clean",
        dev_tasks=DEV_TASKS,
        replay=0.5,
        sampling=SamplingConfig(
            max_new_tokens=64, temperature=temperature, max_prompt_tokens=1536, seed=seed
        ),
        trainer=SFTConfig(lr=5e-4, steps=40, batch_sessions=16, token_budget=8192, warmup_steps=5),
    )


@dataclass(frozen=True, slots=True)
class Comparison:
    """The RL policy against the imitation policy on the same held-out tasks, paired by task."""

    success: PairedComparison
    """Success per task: how many tasks each policy alone solved, McNemar's exact p, the change's interval."""
    tcsr: Interval
    """The change in TCSR (tool calls pooled over the tasks), with its paired bootstrap interval."""

    def describe(self) -> str:
        """Two report lines."""
        s = self.success
        low, high = s.delta.as_list()
        t_low, t_high = self.tcsr.as_list()
        return (
            f"success {s.first_rate:.2f} -> {s.second_rate:.2f} on {s.tasks} tasks: RL alone solved "
            f"{s.second_only}, imitation alone {s.first_only}; exact McNemar p = {s.p_value:.3g}; "
            f"change {s.delta.estimate:+.3f}, 95% CI [{low:+.3f}, {high:+.3f}]\n"
            f"TCSR change {self.tcsr.estimate:+.3f}, 95% CI [{t_low:+.3f}, {t_high:+.3f}] "
            "(paired bootstrap over tasks)"
        )


def compare(before: Evaluation, after: Evaluation) -> Comparison:
    """`after` against `before`, task by task (the tasks both evaluated)."""
    first, second = _by_task(before.sessions), _by_task(after.sessions)
    common = sorted(first.keys() & second.keys())
    success = paired_comparison(
        {t: task_success(first[t]) is True for t in common},
        {t: task_success(second[t]) is True for t in common},
    )
    tcsr = paired_ratio_diff_ci([_calls(first[t]) for t in common], [_calls(second[t]) for t in common])
    return Comparison(success, tcsr)


def _by_task(sessions: Sequence[Session]) -> dict[str, Session]:
    return {str(s.metadata["task_id"]): s for s in sessions}


def _calls(session: Session) -> tuple[float, float]:
    """Successful tool calls and all tool calls of a session (TCSR's numerator and denominator)."""
    calls = session.tool_calls
    return float(sum(c.status == CallStatus.SUCCESS for c in calls)), float(len(calls))


def run_demo(config: RunConfig, console: Console) -> dict[str, Any]:
    """Train as `config` says, evaluate both policies on the held-out tasks, print everything; return the
    summary that the last line shows."""
    started = time.monotonic()
    console.rule("sessionrl demo: imitation, then RL, on orders")
    rft = config.rft
    console.print(
        f"seed {config.seed}; imitation budget: {config.sft.demos} expert sessions, "
        f"{config.sft.trainer.steps} steps of {config.sft.trainer.batch_sessions} sessions; "
        + (
            f"rejection sampling for {rft.rounds} rounds of {rft.tasks} tasks x K={rft.samples} "
            f"(kept: {rft.accept}); "
            if rft is not None
            else ""
        )
        + f"GRPO for {config.rl.iterations} iterations of {config.rl.tasks_per_iteration} tasks x "
        f"K={config.rl.trainer.group_size}; transient tool faults at {config.faults.demo_rate:.0%} in the "
        f"demonstrations, {config.faults.eval_rate:.0%} in RL and evaluation"
        + ("; GRPO on tasks the imitation never saw" if config.rl.unseen_tasks else "")
    )
    result = train(config, console=console)
    split, n = config.evaluation.split, config.evaluation.tasks
    sft = result.report["sft"]
    rl = final_policy(result.report)
    if result.curve:
        console.print(curve_table(result.curve))
    stages = {label: e.metrics for label, e in result.report.items()}
    console.print(metrics_table(stages, title=f"held-out {split} tasks: {n}"))
    comparison = compare(sft, rl)
    console.print(comparison.describe(), markup=False, highlight=False)
    tools = tool_accuracies(sft, rl)
    for line in describe({"sft": sft.tools, "rl": rl.tools} if sft.tools and rl.tools else {}):
        console.print(line, markup=False, highlight=False)
    minutes = (time.monotonic() - started) / 60
    return {
        "n_eval": rl.metrics.n_tasks,
        "sft_success": sft.metrics.success,
        "rl_success": rl.metrics.success,
        "tcsr": rl.metrics.tcsr,
        "dvr": rl.metrics.dvr,
        "spt": rl.metrics.spt,
        "sft_tcsr": sft.metrics.tcsr,
        "sft_spt": sft.metrics.spt,
        "p_success": round(comparison.success.p_value, 6),
        "success_ci": comparison.success.delta.as_list(),
        "tcsr_ci": comparison.tcsr.as_list(),
        "rl_only": comparison.success.second_only,
        "sft_only": comparison.success.first_only,
        "final": rl.label,
        "seed": config.seed,
        "rl_iterations": len(result.curve),
        "stage": result.stage,
        "minutes": round(minutes, 2),
        "rft_dev": dev_verdicts(config.run_dir, "rft_dev"),
        "rl_dev": dev_verdicts(config.run_dir, "rl_dev"),
        **tools,
    }


def dev_verdicts(run_dir: Path, stage: str) -> list[tuple[int, int, bool]]:
    """Each verdict of the dev tasks the run logged under `stage` (`rft_dev`: the rejection-sampling
    rounds, `rft.dev_tasks`; `rl_dev`: GRPO's iterations, `rl.dev_tasks`): dev tasks solved by the weights
    kept before, by the weights judged, and whether those were kept."""
    lines = (run_dir / "metrics.jsonl").read_bytes().splitlines()
    records = [orjson.loads(line) for line in lines if line.strip()]
    return [(r["before"], r["solved"], r["kept"]) for r in records if r["stage"] == stage]


def final_policy(report: dict[str, Evaluation]) -> Evaluation:
    """The evaluation of the policy the run ended with: after GRPO, else after rejection sampling, else
    the imitation policy (a run stopped at the gate)."""
    return report.get("rl") or report.get("rft") or report["sft"]


def tool_accuracies(sft: Evaluation, rl: Evaluation) -> dict[str, Any]:
    """The summary's per-turn tool accuracy keys: `tool_acc_sft`, `tool_acc_rl`, the paired change's
    interval `tool_acc_ci`, and `tool_counts` (per task, each policy's exact and scored turns) so that a
    bench can pool seeds; empty where either was not measured."""
    if sft.tools is None or rl.tools is None:
        return {}
    counts = paired_counts(sft.tools, rl.tools)
    pooled = pooled_change([c[0] for c in counts.values()], [c[1] for c in counts.values()])
    return {
        "tool_acc_sft": round(sft.tools.accuracy, 4),
        "tool_acc_rl": round(rl.tools.accuracy, 4),
        "tool_acc_ci": pooled["ci"],
        "tool_counts": counts,
    }


def main(
    run_dir: Path = Path("runs/demo"),
    *,
    seed: int = 0,
    rl_iterations: int = RL_ITERATIONS,
    eval_tasks: int = 100,
    console: Console | None = None,
) -> dict[str, Any]:
    """The `sessionrl demo` job: a fresh run folder, the demo, and the JSON summary as the last line."""
    console = console or Console()
    shutil.rmtree(run_dir, ignore_errors=True)
    config = demo_config(run_dir, seed=seed, rl_iterations=rl_iterations, eval_tasks=eval_tasks)
    summary = run_demo(config, console)
    print(orjson.dumps(summary).decode(), flush=True)
    return summary
