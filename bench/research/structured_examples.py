"""The structured examples' RL from their clone, measured on DEV tasks (issue 37).

`examples/orders-aaac.yaml` and `orders-ppo.yaml` clone 30 demonstrations and run RL at rate 1e-3; this
study runs an example's own settings (its imitation, trainer and update sections) with one change at a time
to the update or the trainer (a critic warm-up, another learning rate, ...), at seeds that are not the
example's, and scores every policy greedily on the dev split (as `sessionrl train` scores on test). The test
split is never read here.

    python bench/research/structured_examples.py examples/orders-aaac.yaml --seeds 100 101 [--variants ...]

One JSON line per run goes to stdout (and ``--out``); a table of means per variant ends the output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from sessionrl.envs.base import Split
from sessionrl.envs.gym import StructuredEnv
from sessionrl.train.config import RunConfig
from sessionrl.train.structured.aaac import AAACConfig, train_aaac
from sessionrl.train.structured.imitation import imitate
from sessionrl.train.structured.ppo import PPOConfig, train_ppo
from sessionrl.train.structured.rollout import Summary, evaluate
from sessionrl.train.threads import torch_threads

VARIANTS: dict[str, dict[str, Any]] = {
    "example": {},
    "warmup2": {"critic_warmup": 2},
    "warmup5": {"critic_warmup": 5},
    "lr3e-4": {"lr": 3e-4},
    "warmup5+lr3e-4": {"critic_warmup": 5, "lr": 3e-4},
    "ent0": {"entropy_coef": 0.0},
    "anchor0": {"anchor_coef": 0.0},
    "anchor0.3": {"anchor_coef": 0.3},
    "decay0.99": {"anchor_decay": 0.99},
    "decay0.995": {"anchor_decay": 0.995},
    "anchor0+lr3e-4": {"anchor_coef": 0.0, "lr": 3e-4},
    "anchor0+warmup5": {"anchor_coef": 0.0, "critic_warmup": 5},
    "decay0.99+lr3e-4": {"anchor_decay": 0.99, "lr": 3e-4},
    "decay0.995+warmup5": {"anchor_decay": 0.995, "critic_warmup": 5},
}
"""Changes to the example's update (or, for a key of the trainer's own config such as ``beta0``, to the
trainer's), by name."""

DEV_TASKS = 100


def dev_score(run: Any, env: StructuredEnv, seed: int) -> dict[str, float]:
    """Greedy dev completion and risky share of a cloned or trained policy."""
    with torch_threads(1):
        greedy = Summary.of(evaluate(run.policy, run.encoder, env, Split.DEV, seed=seed))
    return {"dev": greedy.completion, "dev_risk": greedy.risk_share}


def changed(settings: PPOConfig | AAACConfig, changes: dict[str, Any]) -> PPOConfig | AAACConfig:
    """`settings` with `changes` applied: update fields to its update, the others to itself."""
    update_names = {f.name for f in dataclasses.fields(settings.update)}
    update = {k: v for k, v in changes.items() if k in update_names}
    own = {k: v for k, v in changes.items() if k not in update_names}
    return dataclasses.replace(settings, update=dataclasses.replace(settings.update, **update), **own)


def run_seed(example: Path, seed: int, names: list[str]) -> list[dict[str, Any]]:
    """Clone once at `seed` with the example's settings, then every variant from that clone."""
    config = RunConfig.load(example)
    env_section = config.env.model_copy(update={"options": {**config.env.options, "dev": DEV_TASKS}})
    env: StructuredEnv = env_section.build()  # type: ignore[assignment]
    section = config.aaac if config.trainer.value == "aaac" else config.ppo
    if section is None or section.imitation is None:
        raise ValueError(f"{example}: a structured example with an imitation stage is needed")
    settings = section.trainer
    settings = dataclasses.replace(settings, run=dataclasses.replace(settings.run, seed=seed))
    clone = imitate(env, settings.run, section.imitation)
    records = [{"seed": seed, "variant": "clone", **dev_score(clone, env, seed)}]
    for name in names:
        started = time.perf_counter()
        variant = changed(settings, VARIANTS[name])
        if isinstance(variant, AAACConfig):
            trained = train_aaac(env, variant, policy=clone.policy)
        else:
            trained = train_ppo(env, variant, policy=clone.policy)
        history = trained.history
        record = {
            "seed": seed,
            "variant": name,
            **dev_score(trained, env, seed),
            "first_policy_round_kl": next((h.approx_kl for h in history if h.anchor_coef > 0), 0.0),
            "max_anchor_kl": max(h.anchor_kl for h in history),
            "train_first5": statistics.fmean(h.train.completion for h in history[:5]),
            "train_last5": statistics.fmean(h.train.completion for h in history[-5:]),
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(json.dumps(record), flush=True)
        records.append(record)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("example", type=Path, help="an example config (trainer: ppo or aaac)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[100, 101], help="not the example's seed")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="append the records as JSON lines here")
    args = parser.parse_args()
    jobs = [(args.example, s, args.variants) for s in args.seeds]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        records = [r for rs in pool.map(run_seed, *zip(*jobs, strict=True)) for r in rs]
    if args.out is not None:
        with args.out.open("a", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)
    clones = {r["seed"]: r["dev"] for r in records if r["variant"] == "clone"}
    print(f"{args.example}: clone dev {statistics.fmean(clones.values()):.3f} over seeds {sorted(clones)}")
    print(f"{'variant':20} {'dev':>6} {'Δclone':>7} {'above':>6} {'risk':>7} {'kl r1':>6} {'Δexample':>9}")
    dev = {(r["variant"], r["seed"]): r["dev"] for r in records}
    for name in args.variants:
        runs = [r for r in records if r["variant"] == name]
        gains = [r["dev"] - clones[r["seed"]] for r in runs]
        paired = [r["dev"] - dev[("example", r["seed"])] for r in runs if ("example", r["seed"]) in dev]
        versus = f"{statistics.fmean(paired):+9.3f}" if paired else f"{'':9}"
        print(
            f"{name:20} {statistics.fmean(r['dev'] for r in runs):6.3f} {statistics.fmean(gains):+7.3f}"
            f" {sum(g > 0 for g in gains):3d}/{len(gains):<2d}"
            f" {statistics.fmean(r['dev_risk'] for r in runs):7.4f}"
            f" {statistics.fmean(r['first_policy_round_kl'] for r in runs):6.3f} {versus}"
        )


if __name__ == "__main__":
    main()
