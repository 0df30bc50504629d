"""PPO against AAAC on the orders domain: the same seeds, the same starting policy, the same step budget.

For each seed, a structured policy first imitates the expert on training tickets (the imitation stage;
from scratch, the sparse reward is only ever found on stock inquiries, about one ticket in six). PPO and
AAAC then continue from that same cloned policy (cloned once per seed) for the same number of environment
steps; AAAC on the graph state continues from a clone of its own.

Reported per variant (``clone`` is the imitated policy PPO and AAAC start from, without RL), as mean ± std
over the seeds; every variant is measured the same way in each column:
- held-out completion: share of the test tickets solved, greedy;
- mean steps per task: policy steps (finish included) per test ticket, greedy;
- risky share: risky calls over all calls of the test episodes, greedy (a risky call raised a risk flag: a
  refund before the return was confirmed, a second refund, an unconfirmed reshipment);
- training risky share: the same share over sampled episodes on training tickets: an RL run's rollouts,
  averaged over the rounds, and for the clone one sampled pass over every training ticket;
- steps to 80%: environment steps until the training completion, averaged over three rounds, first reached
  0.8 (a run that never got there is left out of the mean and counted).

The expert's completion on the same test tickets (its plans replayed on the policy's action space) is
printed as the ceiling. Each RL variant is also compared with the clone it started from on the same
(seed, test task) pairs: a run more than 0.01 below its own clone is flagged in the per-seed table and
drawn in red on the PNG, whose left panel shows the clone's sampled completion on training tickets as a
dashed line under the learning curves.

Options: ``--state graph`` adds a third variant, AAAC on the graph state (`sessionrl.policy.graph`);
``--prototypes K`` gives every variant K macro-actions mined from the expert's training plans (the
action-space sizes are printed); ``--risk-quantiles K`` gives AAAC a quantile risk critic read as its CVaR.

Runs go to two worker processes (one per core). Rich tables and a PNG of the learning curves
(`runs/bench/aaac_vs_ppo.png`, or ``--png``) come out; the last line is one JSON object: per variant
``<v>_completion``, ``<v>_steps``, ``<v>_risk_share`` (greedy, test), ``<v>_train_risk_share`` (sampled,
training tickets) and ``<v>_steps_to_80``, plus ``steps_to_80`` (variant to steps),
``expert_completion``, for each variant beside PPO ``<v>_vs_ppo_p`` and for each RL variant
``<v>_vs_clone_p`` (exact McNemar on the pooled (seed, test task) pairs), ``<v>_minus_clone_ci`` (95%
bootstrap interval of the pooled completion difference) and ``<v>_below_clone`` (seeds more than 0.01
below their clone).
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

from sessionrl.envs.base import Split
from sessionrl.envs.gym import DecisionGymEnv
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.envs.prototypes import action_space_sizes, expert_prototypes
from sessionrl.eval.significance import PairedComparison, paired_comparison
from sessionrl.train.structured.aaac import AAACConfig, train_aaac
from sessionrl.train.structured.imitation import ImitationConfig, demonstrations, imitate
from sessionrl.train.structured.ppo import PPOConfig, UpdateConfig, train_ppo
from sessionrl.train.structured.rollout import (
    StructuredRunConfig,
    Summary,
    build_run,
    evaluate,
)
from sessionrl.train.threads import torch_threads

OUT = Path("runs/bench")
TARGET = 0.8
SMOOTH = 3
SLACK = 0.01
"""A run whose test completion is more than this below its own clone's is flagged as below the clone."""


@dataclass(frozen=True)
class Result:
    """One run: the variant, the seed, its test summary, its risky share and its learning curve."""

    variant: str
    seed: int
    test: Summary
    solved: dict[str, bool]
    """Each test task, solved or not (greedy)."""
    train_risk_share: float
    """Risky calls over calls of sampled episodes on training tickets (see the module doc)."""
    curve: tuple[tuple[int, float], ...]
    seconds: float
    clone_train: float
    """The clone's completion on training tickets, sampled as the rollouts sample: where RL starts."""

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
    env = OrdersEnv(DomainConfig(time_factor=0, transient_failures=False))
    base = StructuredRunConfig(
        iterations=iterations,
        seed=seed,
        rollout_steps=options["rollout_steps"],
        state="graph" if state == "graph" else "flat",
        prototypes=options["prototypes"],
        threads=options["threads"],
    )
    cloned = imitate(env, base, ImitationConfig(demos=demos, epochs=options["epochs"], lr=1e-2))
    cloning = time.perf_counter() - started
    prototypes = expert_prototypes(env, base.prototypes) if base.prototypes else ()
    with torch_threads(1):
        # every training ticket, as the rollouts draw them (the first `demos` alone were imitated: higher)
        sampled = evaluate(
            cloned.policy, cloned.encoder, env, Split.TRAIN, greedy=False, prototypes=prototypes
        )
    clone = Summary.of(sampled)
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
        risky = statistics.fmean(log.train.risk_share for log in history) if history else clone.risk_share
        curve = tuple((log.env_steps, log.train.completion) for log in history)
        seconds = cloning + time.perf_counter() - started
        solved = {e.task_id: e.success for e in episodes}
        results.append(Result(variant, seed, test, solved, risky, curve, seconds, clone.completion))
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


def clone_of(variant: str) -> str:
    """The clone an RL variant starts from: the graph state's for graph variants, else the flat one's."""
    return "clone_graph" if variant.endswith("_graph") else "clone"


def below_clone(results: list[Result]) -> dict[tuple[str, int], bool]:
    """For every RL run, whether its test completion is more than `SLACK` below its own seed's clone."""
    clones = {(r.variant, r.seed): r.test.completion for r in results if r.variant.startswith("clone")}
    return {
        (r.variant, r.seed): r.test.completion < clones[(clone_of(r.variant), r.seed)] - SLACK
        for r in results
        if not r.variant.startswith("clone")
    }


def plot(results: list[Result], path: Path) -> None:
    """Left: mean training completion against env steps, per variant, with the seeds' range shaded and the
    clone's sampled completion on training tickets as a dashed line. Right: each run's held-out completion
    by seed, its clone's as a black bar, runs more than `SLACK` below their clone in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curves, ends) = plt.subplots(1, 2, figsize=(12, 4))
    for variant in dict.fromkeys(r.variant for r in results if r.curve):
        runs = [r for r in results if r.variant == variant]
        steps = [s for s, _ in runs[0].curve]
        per_step = list(zip(*([c for _, c in r.curve] for r in runs), strict=True))
        curves.plot(steps, [statistics.fmean(v) for v in per_step], label=variant.upper())
        curves.fill_between(steps, [min(v) for v in per_step], [max(v) for v in per_step], alpha=0.2)
    clone_train = statistics.fmean(r.clone_train for r in results)
    curves.axhline(clone_train, color="black", linestyle="--", linewidth=1, label="CLONE (sampled)")
    curves.axhline(TARGET, color="grey", linestyle=":", linewidth=1)
    curves.set_xlabel("environment steps")
    curves.set_ylabel("training completion")
    curves.set_title("orders: PPO vs AAAC from the same cloned policy")
    curves.legend()
    flagged = below_clone(results)
    rl = list(dict.fromkeys(r.variant for r in results if not r.variant.startswith("clone")))
    for r in results:
        if r.variant.startswith("clone"):
            ends.hlines(r.test.completion, r.seed - 0.4, r.seed + 0.4, color="black", linewidth=2)
            continue
        x = r.seed - 0.25 + 0.5 * rl.index(r.variant) / max(1, len(rl) - 1)
        below = flagged[(r.variant, r.seed)]
        ends.scatter(x, r.test.completion, color="red" if below else f"C{rl.index(r.variant)}", zorder=3)
    for i, variant in enumerate(rl):
        ends.scatter([], [], color=f"C{i}", label=variant.upper())
    ends.plot([], [], color="black", linewidth=2, label="CLONE (greedy)")
    ends.scatter([], [], color="red", label=f"below clone - {SLACK}")
    ends.set_xlabel("seed")
    ends.set_ylabel("held-out completion (greedy)")
    ends.set_title("each run against its own clone")
    ends.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def expert_completion(prototypes: int) -> float:
    """The share of test tickets the expert's plans solve when replayed on the policy's action space."""
    env = OrdersEnv(DomainConfig(time_factor=0, transient_failures=False))
    run = StructuredRunConfig(prototypes=prototypes)
    policy, encoder, collector = build_run(env, run)
    collector.close()
    tasks = list(env.tasks(Split.TEST))
    return demonstrations(env, tasks, policy.layout, encoder, run).solved / len(tasks)


def per_seed_table(results: list[Result], names: tuple[str, ...]) -> Table:
    """Held-out completion by seed and variant; RL runs more than `SLACK` below their clone in red."""
    flagged = below_clone(results)
    table = Table(title=f"held-out completion by seed (red: more than {SLACK} below its clone)")
    table.add_column("seed", justify="right")
    for variant in names:
        table.add_column(variant.upper(), justify="right")
    for seed in sorted({r.seed for r in results}):
        cells = []
        for variant in names:
            run = next(r for r in results if r.variant == variant and r.seed == seed)
            text = f"{run.test.completion:.3f}"
            cells.append(f"[red]{text} ↓[/red]" if flagged.get((variant, seed), False) else text)
        table.add_row(str(seed), *cells)
    return table


def arguments() -> argparse.Namespace:
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
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads of each training run")
    parser.add_argument("--png", type=Path, default=OUT / "aaac_vs_ppo.png", help="where the figure goes")
    return parser.parse_args()


def variant_table(results: list[Result], names: tuple[str, ...], title: str) -> tuple[Table, dict[str, Any]]:
    """The mean ± std table per variant and its JSON fields (see the module doc)."""
    table = Table(title=title)
    columns = (
        "variant",
        "test completion",
        "steps / task",
        "risky share",
        "training risky share",
        "steps to 80%",
        "below clone",
    )
    for column in (*columns, "s / run"):
        table.add_column(column, justify="right")
    flagged = below_clone(results)
    summary: dict[str, Any] = {}
    to_80: dict[str, int | None] = {}
    for variant in names:
        runs = [r for r in results if r.variant == variant]
        completion = mean_std([r.test.completion for r in runs])
        steps = mean_std([r.test.mean_steps for r in runs])
        risk = mean_std([r.test.risk_share for r in runs])
        train_risk = mean_std([r.train_risk_share for r in runs])
        reached = [r.steps_to_target for r in runs if r.steps_to_target is not None]
        to_target = statistics.fmean(reached) if reached else None
        below = sum(flagged.get((variant, r.seed), False) for r in runs)
        table.add_row(
            variant.upper(),
            f"{completion[0]:.3f} ± {completion[1]:.3f}",
            f"{steps[0]:.2f} ± {steps[1]:.2f}",
            f"{risk[0]:.4f} ± {risk[1]:.4f}",
            f"{train_risk[0]:.4f} ± {train_risk[1]:.4f}",
            f"{to_target:.0f} ({len(reached)}/{len(runs)})"
            if to_target is not None
            else f"not reached (0/{len(runs)})",
            "-" if variant.startswith("clone") else f"{below}/{len(runs)}",
            f"{statistics.fmean(r.seconds for r in runs):.0f}",
        )
        to_80[variant] = round(to_target) if to_target is not None else None
        summary |= {
            f"{variant}_completion": round(completion[0], 4),
            f"{variant}_steps": round(steps[0], 3),
            f"{variant}_risk_share": round(risk[0], 5),
            f"{variant}_train_risk_share": round(train_risk[0], 5),
            f"{variant}_steps_to_80": to_80[variant],
        }
    return table, summary | {"steps_to_80": to_80}


def comparisons(results: list[Result], names: tuple[str, ...], console: Console) -> dict[str, Any]:
    """Each RL variant against its clone, and each variant beside PPO against PPO, over the pooled
    (seed, test task) pairs: printed, and returned as JSON fields (see the module doc)."""
    flagged = below_clone(results)
    seeds = sorted({r.seed for r in results})
    pairs = [(clone_of(v), v, "its clone") for v in names if not v.startswith("clone")]
    pairs += [("ppo", v, "PPO") for v in names if v not in ("ppo", "clone")]
    summary: dict[str, Any] = {}
    for first, second, label in pairs:
        compared = versus(results, first, second)
        line = (
            f"{second.upper()} vs {label} over seeds × test tasks: completion {compared.delta.estimate:+.3f} "
            f"(95% CI {compared.delta.low:+.3f} to {compared.delta.high:+.3f}), "
            f"McNemar p = {compared.p_value:.4f}"
        )
        if first == "ppo":
            summary[f"{second}_vs_ppo_p"] = round(compared.p_value, 5)
        else:
            below = sum(flagged[(second, s)] for s in seeds)
            line += f"; more than {SLACK} below the clone at {below}/{len(seeds)} seeds"
            summary |= {
                f"{second}_vs_clone_p": round(compared.p_value, 5),
                f"{second}_minus_clone_ci": compared.delta.as_list(),
                f"{second}_below_clone": below,
            }
        console.print(line)
    return summary


def main() -> None:
    args = arguments()
    console = Console(width=120)
    if args.prototypes:
        env = OrdersEnv(DomainConfig(time_factor=0, transient_failures=False))
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
        "threads": args.threads,
    }
    names = variants(args.state)
    states = ("flat", "graph") if args.state == "graph" else ("flat",)
    jobs = [(st, s, args.iterations, args.demos, options) for s in range(args.seeds) for st in states]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = [r for rs in pool.map(run_seed, *zip(*jobs, strict=True)) for r in rs]
    wall = time.perf_counter() - started

    budget = args.iterations * args.rollout_steps * StructuredRunConfig().num_envs
    title = (
        f"orders, {args.seeds} seeds, {budget} steps each, from {args.demos} demos, {args.threads} thread(s)"
    )
    table, summary = variant_table(results, names, title)
    ceiling = expert_completion(args.prototypes)
    console.print(table)
    console.print(per_seed_table(results, names))
    console.print(f"ceiling: the expert's plans solve {ceiling:.3f} of the test tickets")
    summary |= {"expert_completion": round(ceiling, 4)} | comparisons(results, names, console)
    plot(results, args.png)
    console.print(f"learning curves: {args.png}; wall time {wall:.0f} s")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
