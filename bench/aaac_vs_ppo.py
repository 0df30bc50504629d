"""PPO against AAAC on the orders domain: the same seeds, the same starting policy, the same step budget.

For each seed, a structured policy first imitates the expert on a few training tickets (the imitation
stage; from scratch, the sparse reward is only ever found on stock inquiries, about one ticket in six).
PPO and AAAC then continue from that same cloned policy for the same number of environment steps.

Reported per algorithm, as mean ± std over the seeds:
- held-out completion: share of the test tickets solved, greedy;
- mean steps per task: policy steps (finish included) per test ticket, greedy;
- risky share: risky calls over all calls of the training episodes, averaged over the rounds (a risky call
  raised a risk flag: a refund before the return was confirmed, a second refund, an unconfirmed reshipment);
- steps to 80%: environment steps until the training completion, averaged over three rounds, first reached
  0.8 (a run that never got there is left out of the mean and counted).

Runs go to two worker processes (one per core). A rich table and a PNG of the learning curves
(`runs/bench/aaac_vs_ppo.png`) come out; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sessionrl.envs import build
from sessionrl.envs.base import Split
from sessionrl.train.structured.aaac import AAACConfig, train_aaac
from sessionrl.train.structured.imitation import ImitationConfig, imitate
from sessionrl.train.structured.ppo import PPOConfig, train_ppo
from sessionrl.train.structured.rollout import StructuredRunConfig, Summary, evaluate, torch_threads

OUT = Path("runs/bench")
ALGORITHMS = ("ppo", "aaac")
TARGET = 0.8
SMOOTH = 3


@dataclass(frozen=True)
class Result:
    """One run: the algorithm, the seed, its test summary, its risky share and its learning curve."""

    algorithm: str
    seed: int
    test: Summary
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


def run_one(algorithm: str, seed: int, iterations: int, demos: int) -> Result:
    """Imitate, then train with `algorithm`; evaluate greedily on the test split."""
    started = time.perf_counter()
    env = build("orders", time_factor=0, transient_failures=False)
    run = StructuredRunConfig(iterations=iterations, seed=seed)
    cloned = imitate(env, run, ImitationConfig(demos=demos, epochs=150, lr=1e-2))
    if algorithm == "ppo":
        trained = train_ppo(env, PPOConfig(run=run), policy=cloned.policy)
    else:
        trained = train_aaac(env, AAACConfig(run=run), policy=cloned.policy)
    with torch_threads(1):
        test = Summary.of(evaluate(trained.policy, trained.encoder, env, Split.TEST))
    risky = statistics.fmean(log.train.risk_share for log in trained.history)
    curve = tuple((log.env_steps, log.train.completion) for log in trained.history)
    return Result(algorithm, seed, test, risky, curve, time.perf_counter() - started)


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def plot(results: list[Result], path: Path) -> None:
    """Mean training completion against env steps, per algorithm, with the seeds' range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for algorithm in ALGORITHMS:
        runs = [r for r in results if r.algorithm == algorithm]
        steps = [s for s, _ in runs[0].curve]
        per_step = list(zip(*([c for _, c in r.curve] for r in runs), strict=True))
        ax.plot(steps, [statistics.fmean(v) for v in per_step], label=algorithm.upper())
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
    parser.add_argument("--iterations", type=int, default=50, help="rounds of 512 steps per run")
    parser.add_argument("--demos", type=int, default=30, help="training tickets the policy imitates first")
    args = parser.parse_args()
    jobs = [(a, s, args.iterations, args.demos) for s in range(args.seeds) for a in ALGORITHMS]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run_one, *zip(*jobs, strict=True)))
    wall = time.perf_counter() - started

    table = Table(
        title=f"orders, {args.seeds} seeds, {args.iterations * 512} steps each, from {args.demos} demos"
    )
    for column in ("algorithm", "test completion", "steps / task", "risky share", "steps to 80%", "s / run"):
        table.add_column(column, justify="right")
    summary: dict[str, float | int | None] = {}
    for algorithm in ALGORITHMS:
        runs = [r for r in results if r.algorithm == algorithm]
        completion = mean_std([r.test.completion for r in runs])
        steps = mean_std([r.test.mean_steps for r in runs])
        risk = mean_std([r.risk_share for r in runs])
        reached = [r.steps_to_target for r in runs if r.steps_to_target is not None]
        to_target = statistics.fmean(reached) if reached else None
        table.add_row(
            algorithm.upper(),
            f"{completion[0]:.3f} ± {completion[1]:.3f}",
            f"{steps[0]:.2f} ± {steps[1]:.2f}",
            f"{risk[0]:.4f} ± {risk[1]:.4f}",
            f"{to_target:.0f} ({len(reached)}/{len(runs)})"
            if to_target is not None
            else f"not reached (0/{len(runs)})",
            f"{statistics.fmean(r.seconds for r in runs):.0f}",
        )
        summary |= {
            f"{algorithm}_completion": round(completion[0], 4),
            f"{algorithm}_steps": round(steps[0], 3),
            f"{algorithm}_risk_share": round(risk[0], 5),
            f"{algorithm}_steps_to_80": round(to_target) if to_target is not None else None,
        }
    console = Console(width=120)
    console.print(table)
    plot(results, OUT / "aaac_vs_ppo.png")
    console.print(f"learning curves: {OUT / 'aaac_vs_ppo.png'}; wall time {wall:.0f} s")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
