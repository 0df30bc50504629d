"""PPO against AAAC on the orders domain: the same seeds, the same starting policy, the same step budget.

For each seed, a structured policy first imitates the expert on training tickets (the imitation stage;
from scratch, the sparse reward is only ever found on stock inquiries, about one ticket in six). PPO and
AAAC then continue from that same cloned policy (cloned once per seed) for the same number of environment
steps; AAAC on the graph state continues from a clone of its own.

Reported per variant (``clone`` is the imitated policy PPO and AAAC start from, without RL; its risky
share is that of its test episodes), as mean ± std over the seeds:
- held-out completion: share of the test tickets solved, greedy;
- mean steps per task: policy steps (finish included) per test ticket, greedy;
- risky share: risky calls over all calls of the training episodes, averaged over the rounds (a risky call
  raised a risk flag: a refund before the return was confirmed, a second refund, an unconfirmed reshipment);
- steps to 80%: environment steps until the training completion, averaged over three rounds, first reached
  0.8 (a run that never got there is left out of the mean and counted).

Options: ``--state graph`` adds a third variant, AAAC on the graph state (`sessionrl.policy.graph`);
``--prototypes K`` gives every variant K macro-actions mined from the expert's training plans (the
action-space sizes are printed); ``--risk-quantiles K`` gives AAAC a quantile risk critic read as its CVaR.

Runs go to two worker processes (one per core). A rich table and a PNG of the learning curves
(`runs/bench/aaac_vs_ppo.png`) come out; the last line is one JSON object: per variant ``<v>_completion``,
``<v>_steps``, ``<v>_risk_share`` and ``<v>_steps_to_80``, plus ``steps_to_80`` (variant to steps) and,
for each variant beside PPO, ``<v>_vs_ppo_p``: McNemar's p on the (seed, test task) pairs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sessionrl.envs import build
from sessionrl.envs.base import Split
from sessionrl.envs.gym import DecisionGymEnv
from sessionrl.envs.prototypes import action_space_sizes, expert_prototypes
from sessionrl.eval.significance import PairedComparison, paired_comparison
from sessionrl.train.structured.aaac import AAACConfig, train_aaac
from sessionrl.train.structured.imitation import ImitationConfig, imitate
from sessionrl.train.structured.ppo import PPOConfig, UpdateConfig, train_ppo
from sessionrl.train.structured.rollout import StructuredRunConfig, Summary, evaluate, torch_threads

OUT = Path("runs/bench")
TARGET = 0.8
SMOOTH = 3


@dataclass(frozen=True)
class Result:
    """One run: the variant, the seed, its test summary, its risky share and its learning curve."""

    variant: str
    seed: int
    test: Summary
    solved: dict[str, bool]
    """Each test task, solved or not (greedy)."""
    risk_share: float
    curve: tuple[tuple[int, float], ...]
    seconds: float

    @property
    def steps_to_target(self) -> int | None:
        """Env steps until the smoothed training completion first reached `TARGET` (None: never)."""
        values = [c for _, c in self.curve]
        for i in range(len(values)):
            window = values[max(0, i - SMOOTH + 1) : i + 1]
            if len(window) == SMOOTH and statistics.fmean(window) >= TARGET:
                return self.curve[i][0]
        return None


def variants(state: str) -> tuple[str, ...]:
    """The clone, PPO and AAAC on the flat state, and the clone and AAAC on the graph state when asked."""
    graph = ("clone_graph", "aaac_graph") if state == "graph" else ()
    return ("clone", "ppo", "aaac", *graph)


def run_seed(state: str, seed: int, iterations: int, demos: int, options: dict[str, Any]) -> list[Result]:
    """Imitate once on `state`, then train each variant of that state from the clone (flat: PPO and AAAC;
    graph: AAAC) and evaluate greedily on the test split. `options` hold ``prototypes``,
    ``risk_quantiles``, ``rollout_steps``, ``epochs`` (of imitation), ``lr`` (of the RL updates) and
    ``beta0`` (AAAC's KL)."""
    started = time.perf_counter()
    env = build("orders", time_factor=0, transient_failures=False)
    base = StructuredRunConfig(
        iterations=iterations,
        seed=seed,
        rollout_steps=options["rollout_steps"],
        state="graph" if state == "graph" else "flat",
        prototypes=options["prototypes"],
    )
    cloned = imitate(env, base, ImitationConfig(demos=demos, epochs=options["epochs"], lr=1e-2))
    cloning = time.perf_counter() - started
    prototypes = expert_prototypes(env, base.prototypes) if base.prototypes else ()
    update = UpdateConfig(lr=options["lr"])
    results = []
    for variant in ("clone_graph", "aaac_graph") if state == "graph" else ("clone", "ppo", "aaac"):
        started = time.perf_counter()
        if variant.startswith("clone"):
            trained = cloned
        elif variant == "ppo":
            trained = train_ppo(env, PPOConfig(run=base, update=update), policy=cloned.policy)
        else:
            run = replace(base, risk_quantiles=options["risk_quantiles"])
            aaac = AAACConfig(run=run, update=update, beta0=options["beta0"])
            trained = train_aaac(env, aaac, policy=cloned.policy)
        with torch_threads(1):
            episodes = evaluate(trained.policy, trained.encoder, env, Split.TEST, prototypes=prototypes)
        test = Summary.of(episodes)
        history = trained.history
        risky = statistics.fmean(log.train.risk_share for log in history) if history else test.risk_share
        curve = tuple((log.env_steps, log.train.completion) for log in history)
        seconds = cloning + time.perf_counter() - started
        solved = {e.task_id: e.success for e in episodes}
        results.append(Result(variant, seed, test, solved, risky, curve, seconds))
    return results


def versus(results: list[Result], first: str, second: str) -> PairedComparison:
    """`second` against `first` on the same (seed, test task) pairs: McNemar on the solved flags and a
    bootstrap interval of the completion difference."""

    def outcomes(variant: str) -> dict[str, bool]:
        return {
            f"{r.seed}:{task}": ok for r in results if r.variant == variant for task, ok in r.solved.items()
        }

    return paired_comparison(outcomes(first), outcomes(second))


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def plot(results: list[Result], path: Path) -> None:
    """Mean training completion against env steps, per variant, with the seeds' range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for variant in dict.fromkeys(r.variant for r in results if r.curve):
        runs = [r for r in results if r.variant == variant]
        steps = [s for s, _ in runs[0].curve]
        per_step = list(zip(*([c for _, c in r.curve] for r in runs), strict=True))
        ax.plot(steps, [statistics.fmean(v) for v in per_step], label=variant.upper())
        ax.fill_between(steps, [min(v) for v in per_step], [max(v) for v in per_step], alpha=0.2)
    ax.axhline(TARGET, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("training completion")
    ax.set_title("orders: PPO vs AAAC from the same cloned policy")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per algorithm")
    parser.add_argument("--iterations", type=int, default=50, help="rollout-then-update rounds per run")
    parser.add_argument("--demos", type=int, default=200, help="training tickets the policy imitates first")
    parser.add_argument("--epochs", type=int, default=150, help="imitation passes over the demonstrations")
    parser.add_argument(
        "--state", choices=("flat", "graph"), default="flat", help="graph: add AAAC on graphs"
    )
    parser.add_argument(
        "--prototypes", type=int, nargs="?", const=8, default=0, help="macro-actions mined (flag alone: 8)"
    )
    parser.add_argument("--risk-quantiles", type=int, default=0, help="AAAC's risk quantiles (0: one value)")
    parser.add_argument("--lr", type=float, default=3e-4, help="Adam learning rate of the RL updates")
    parser.add_argument("--beta0", type=float, default=2.0, help="AAAC's KL coefficient at its first step")
    parser.add_argument("--rollout-steps", type=int, default=64, help="steps per environment per round")
    args = parser.parse_args()
    console = Console(width=120)
    if args.prototypes:
        env = build("orders", time_factor=0, transient_failures=False)
        with DecisionGymEnv(env, Split.TRAIN) as gym_env:
            sizes = action_space_sizes(gym_env, expert_prototypes(env, args.prototypes))
        console.print(
            f"skill head: {sizes['atomic']} actions atomic, {sizes['with_prototypes']} with prototypes"
        )
    options = {
        "prototypes": args.prototypes,
        "risk_quantiles": args.risk_quantiles,
        "rollout_steps": args.rollout_steps,
        "epochs": args.epochs,
        "lr": args.lr,
        "beta0": args.beta0,
    }
    names = variants(args.state)
    states = ("flat", "graph") if args.state == "graph" else ("flat",)
    jobs = [(st, s, args.iterations, args.demos, options) for s in range(args.seeds) for st in states]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = [r for rs in pool.map(run_seed, *zip(*jobs, strict=True)) for r in rs]
    wall = time.perf_counter() - started

    budget = args.iterations * args.rollout_steps * StructuredRunConfig().num_envs
    table = Table(title=f"orders, {args.seeds} seeds, {budget} steps each, from {args.demos} demos")
    for column in ("variant", "test completion", "steps / task", "risky share", "steps to 80%", "s / run"):
        table.add_column(column, justify="right")
    summary: dict[str, Any] = {}
    to_80: dict[str, int | None] = {}
    for variant in names:
        runs = [r for r in results if r.variant == variant]
        completion = mean_std([r.test.completion for r in runs])
        steps = mean_std([r.test.mean_steps for r in runs])
        risk = mean_std([r.risk_share for r in runs])
        reached = [r.steps_to_target for r in runs if r.steps_to_target is not None]
        to_target = statistics.fmean(reached) if reached else None
        table.add_row(
            variant.upper(),
            f"{completion[0]:.3f} ± {completion[1]:.3f}",
            f"{steps[0]:.2f} ± {steps[1]:.2f}",
            f"{risk[0]:.4f} ± {risk[1]:.4f}",
            f"{to_target:.0f} ({len(reached)}/{len(runs)})"
            if to_target is not None
            else f"not reached (0/{len(runs)})",
            f"{statistics.fmean(r.seconds for r in runs):.0f}",
        )
        to_80[variant] = round(to_target) if to_target is not None else None
        summary |= {
            f"{variant}_completion": round(completion[0], 4),
            f"{variant}_steps": round(steps[0], 3),
            f"{variant}_risk_share": round(risk[0], 5),
            f"{variant}_steps_to_80": to_80[variant],
        }
    summary["steps_to_80"] = to_80
    console.print(table)
    for other in [v for v in names if v not in ("ppo", "clone")]:
        compared = versus(results, "ppo", other)
        console.print(
            f"{other.upper()} vs PPO over seeds × test tasks: completion {compared.delta.estimate:+.3f} "
            f"(95% CI {compared.delta.low:+.3f} to {compared.delta.high:+.3f}), "
            f"McNemar p = {compared.p_value:.4f}"
        )
        summary[f"{other}_vs_ppo_p"] = round(compared.p_value, 5)
    plot(results, OUT / "aaac_vs_ppo.png")
    console.print(f"learning curves: {OUT / 'aaac_vs_ppo.png'}; wall time {wall:.0f} s")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
