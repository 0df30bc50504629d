"""Why structured RL loses ground from a strong clone: candidate causes measured on DEV tasks (issue 37).

Each seed clones the expert once (as `bench/aaac_vs_ppo.py` does), then every variant continues from that
clone with one change to the update: a critic warm-up, another entropy bonus or learning rate, an anchor
to the clone (a decaying KL), or several together. Every policy is scored on the dev split, greedy (as the
bench and `sessionrl train` evaluate) and sampled (as training acts), so the gap between the two shows.
The test split is never read here.

    python bench/research/structured_from_clone.py --seeds 2 --demos 200 [--variants base warmup ...]

One JSON line per run goes to stdout (and ``--out``); a table of means per variant ends the output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from sessionrl.envs.base import Split
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.train.structured.aaac import AAACConfig, train_aaac
from sessionrl.train.structured.imitation import ImitationConfig, imitate
from sessionrl.train.structured.ppo import PPOConfig, UpdateConfig, train_ppo
from sessionrl.train.structured.rollout import StructuredRunConfig, Summary, evaluate
from sessionrl.train.threads import torch_threads

BENCH_UPDATE = UpdateConfig(lr=3e-4, anchor_coef=0.0)
"""The update `bench/aaac_vs_ppo.py` ran before this study (its ``--lr`` default; the rest as the trainer's
defaults then: entropy 0.01, no warm-up, no anchor)."""

VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "warmup5": {"critic_warmup": 5},
    "ent0": {"entropy_coef": 0.0},
    "lr1e-4": {"lr": 1e-4},
    "lr1e-3": {"lr": 1e-3},
    "anchor0.3": {"anchor_coef": 0.3},
    "anchor1": {"anchor_coef": 1.0},
    "anchor3": {"anchor_coef": 3.0},
    "warmup5+anchor1": {"critic_warmup": 5, "anchor_coef": 1.0},
    "warmup5+ent0": {"critic_warmup": 5, "entropy_coef": 0.0},
    "warmup5+ent0+anchor1": {"critic_warmup": 5, "entropy_coef": 0.0, "anchor_coef": 1.0},
    "std": {"refit_std": True},
    "std+warmup5": {"refit_std": True, "critic_warmup": 5},
    "std+ent0": {"refit_std": True, "entropy_coef": 0.0},
    "std+anchor0.3": {"refit_std": True, "anchor_coef": 0.3},
    "std+anchor1": {"refit_std": True, "anchor_coef": 1.0},
    "std+lr1e-3": {"refit_std": True, "lr": 1e-3},
    "std+anchor1+lr1e-3": {"refit_std": True, "anchor_coef": 1.0, "lr": 1e-3},
    "std+warmup5+anchor1": {"refit_std": True, "critic_warmup": 5, "anchor_coef": 1.0},
    "std+warmup5+anchor1+lr1e-3": {"refit_std": True, "critic_warmup": 5, "anchor_coef": 1.0, "lr": 1e-3},
}
"""Changes to `BENCH_UPDATE`, by name; ``refit_std`` starts from the clone whose σ was refitted
(`imitation.refit_log_std`), the others from the clone as gradient steps left it."""


def scores(run: Any, env: Any) -> dict[str, float]:
    """Dev completion (greedy and sampled) and the greedy risky share of a trained or cloned run."""
    with torch_threads(1):
        greedy = Summary.of(evaluate(run.policy, run.encoder, env, Split.DEV))
        sampled = Summary.of(evaluate(run.policy, run.encoder, env, Split.DEV, greedy=False, seed=1))
    return {"dev": greedy.completion, "dev_sampled": sampled.completion, "dev_risk": greedy.risk_share}


def run_seed(
    seed: int, demos: int, iterations: int, algos: list[str], names: list[str]
) -> list[dict[str, Any]]:
    """Clone once for `seed`, then every (algorithm, variant) from that clone; one record per run."""
    env = OrdersEnv(DomainConfig(dev=100, time_factor=0, transient_failures=False))
    base = StructuredRunConfig(iterations=iterations, seed=seed)
    imitation = ImitationConfig(demos=demos, epochs=150, lr=1e-2, refit_std=False)
    clones = {refit: imitate(env, base, replace(imitation, refit_std=refit)) for refit in (False, True)}
    records = [
        {"seed": seed, "demos": demos, "algo": "clone", "variant": f"refit_std={refit}", **scores(c, env)}
        for refit, c in clones.items()
    ]
    for algo in algos:
        for name in names:
            started = time.perf_counter()
            changes = dict(VARIANTS[name])
            cloned = clones[changes.pop("refit_std", False)]
            update = replace(BENCH_UPDATE, **changes)
            if algo == "ppo":
                trained = train_ppo(env, PPOConfig(run=base, update=update), policy=cloned.policy)
            else:
                aaac = AAACConfig(run=base, update=update, beta0=2.0)
                trained = train_aaac(env, aaac, policy=cloned.policy)
            curve = [log.train.completion for log in trained.history]
            record = {
                "seed": seed,
                "demos": demos,
                "algo": algo,
                "variant": name,
                **scores(trained, env),
                "train_first5": statistics.fmean(curve[:5]),
                "train_last5": statistics.fmean(curve[-5:]),
                "train_risk": statistics.fmean(log.train.risk_share for log in trained.history),
                "seconds": time.perf_counter() - started,
            }
            print(json.dumps(record), flush=True)
            records.append(record)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[100, 101], help="seeds (not the bench's)")
    parser.add_argument("--demos", type=int, default=200)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--algos", nargs="+", default=["ppo", "aaac"], choices=["ppo", "aaac"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="append the records as JSON lines here")
    args = parser.parse_args()
    jobs = [(s, args.demos, args.iterations, args.algos, args.variants) for s in args.seeds]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        records = [r for rs in pool.map(run_seed, *zip(*jobs, strict=True)) for r in rs]
    if args.out is not None:
        with args.out.open("a", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)
    clone = statistics.fmean(r["dev"] for r in records if r["algo"] == "clone")
    print(f"clone dev completion (greedy) {clone:.3f}; {len(args.seeds)} seeds, {args.demos} demos")
    print(f"{'algo':5} {'variant':28} {'dev':>6} {'Δclone':>7} {'sampled':>8} {'risk':>7} {'tr first5':>9}")
    clone_rows = ["refit_std=False", "refit_std=True"]
    for algo in ["clone", *args.algos]:
        for name in clone_rows if algo == "clone" else args.variants:
            runs = [r for r in records if r["algo"] == algo and r["variant"] == name]
            dev = statistics.fmean(r["dev"] for r in runs)
            first = statistics.fmean(r.get("train_first5", float("nan")) for r in runs)
            print(
                f"{algo:5} {name:28} {dev:6.3f} {dev - clone:+7.3f} "
                f"{statistics.fmean(r['dev_sampled'] for r in runs):8.3f} "
                f"{statistics.fmean(r['dev_risk'] for r in runs):7.4f} {first:9.3f}"
            )


if __name__ == "__main__":
    main()
