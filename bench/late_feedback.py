"""Late feedback that trains: GRPO with a share of verdicts arriving iterations late, against dropping them.

A share of the RL sessions (`rl.late_share`) only receives its verdict `rl.late_after` iterations after it
was sampled, as annotators' outcomes do. The reward shaper holds each until then; the trainer reads it
from the change feed a few policy versions later and trains on it with the off-policy correction: each
token is reweighted by min(π_trainer / π_behaviour, is_cap) against the log-probabilities the older
policy recorded, and the session is ranked against its whole group (its peers, trained before it,
count in the baseline). The other arm drops late sessions (`rl.max_lag: 0`: a session sampled by an older
version is stale, left out and counted).

Both arms start from one imitation policy (the demo's recipe, trained once and copied), run the same
GRPO iterations on the same tasks with the same late sessions, and are evaluated greedily on the same
held-out test tasks. The comparison is paired by task: exact McNemar on success, with a bootstrap
interval of the change. From the late arm's updates: the share of tokens whose importance ratio the cap
cut (`is_truncated`) and the mean importance weight (`is_weight`), token-weighted over all updates and
over the updates that trained late sessions.

`--jobs 2` runs the two arms at once, each in its own process. `--reuse` starts the arms from the
imitation run already in `--out` (its gate passed) instead of training it again.

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import orjson
import torch
from rich.console import Console

from sessionrl.train.config import RunConfig
from sessionrl.train.llm.checkpoint import Stage, read_state
from sessionrl.train.llm.demo import GRPO_ITERATIONS, compare, demo_config
from sessionrl.train.llm.evaluation import Evaluation
from sessionrl.train.llm.loop import TrainResult, train


def arm(
    imitation: RunConfig, folder: Path, *, iterations: int, late_share: float, late_after: int, max_lag: int
) -> RunConfig:
    """The imitation run's config with its RL stage set for one arm, in `folder`."""
    rl = imitation.rl.model_copy(
        update={
            "iterations": iterations,
            "late_share": late_share,
            "late_after": late_after,
            "max_lag": max_lag,
        }
    )
    return imitation.model_copy(update={"run_dir": folder, "rl": rl})


def run_arm(imitation: RunConfig, config: RunConfig, threads: int, quiet: bool) -> TrainResult:
    """GRPO for `config`, resumed from a copy of the imitation run (its gate passed, RL not started)."""
    torch.set_num_threads(threads)
    shutil.rmtree(config.run_dir, ignore_errors=True)
    shutil.copytree(imitation.run_dir, config.run_dir)
    return train(config, resume=True, console=Console(stderr=True, quiet=quiet))


def imitate(base: RunConfig, reuse: bool, console: Console) -> None:
    """The imitation run both arms start from: trained (and its policy evaluated) unless `reuse` finds
    one whose gate passed."""
    saved = read_state(base.run_dir / "checkpoint") if reuse else None
    if saved is not None and saved.stage is Stage.RL and saved.step == 0:
        return
    shutil.rmtree(base.run_dir, ignore_errors=True)
    train(base, console=console)


def arms(args: argparse.Namespace, base: RunConfig) -> tuple[TrainResult, TrainResult]:
    """The arm that drops late sessions and the arm that trains on them, one after the other or at once."""
    shared = {"iterations": args.rl_iterations, "late_share": args.late_share, "late_after": args.late_after}
    configs = (
        arm(base, args.out / "drop", **shared, max_lag=0),
        arm(base, args.out / "late", **shared, max_lag=args.late_after),
    )
    if args.jobs <= 1:
        drop, late = (run_arm(base, c, args.threads, not args.verbose) for c in configs)
        return drop, late
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_arm, base, c, args.threads, not args.verbose) for c in configs]
        return futures[0].result(), futures[1].result()


def weighted(curve: Sequence[dict[str, Any]], key: str) -> float | None:
    """`key` of the updates in `curve`, weighted by their policy tokens (None: no update logged it)."""
    rows = [(r[key], r["policy_tokens"]) for r in curve if key in r]
    total = sum(n for _, n in rows)
    return round(sum(v * n for v, n in rows) / total, 6) if total else None


def correction(curve: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The off-policy correction the late arm applied: over all updates, and over those with late
    sessions."""
    late = [r for r in curve if r.get("late", 0) > 0]
    return {
        "late_trained": sum(r.get("late", 0) for r in curve),
        "is_truncated": weighted(curve, "is_truncated"),
        "is_weight": weighted(curve, "is_weight"),
        "is_abs_diff": weighted(curve, "is_abs_diff"),
        "is_truncated_late_updates": weighted(late, "is_truncated"),
        "is_weight_late_updates": weighted(late, "is_weight"),
        "is_abs_diff_late_updates": weighted(late, "is_abs_diff"),
    }


def summary(args: argparse.Namespace, drop: TrainResult, late: TrainResult) -> dict[str, Any]:
    """The comparison's figures (late arm against drop arm, paired by task)."""
    sft: Evaluation = drop.report["sft"]
    drop_rl, late_rl = drop.report["rl"], late.report["rl"]
    paired = compare(drop_rl, late_rl)
    s = paired.success
    return {
        "seed": args.seed,
        "late_share": args.late_share,
        "late_after": args.late_after,
        "rl_iterations": args.rl_iterations,
        "sft_steps": args.sft_steps,
        "n_eval": s.tasks,
        "sft_success": sft.metrics.success,
        "drop_success": drop_rl.metrics.success,
        "late_success": late_rl.metrics.success,
        "late_only": s.second_only,
        "drop_only": s.first_only,
        "p_success": round(s.p_value, 6),
        "success_ci": s.delta.as_list(),
        "tcsr_drop": drop_rl.metrics.tcsr,
        "tcsr_late": late_rl.metrics.tcsr,
        "dropped": sum(r.get("stale", 0) for r in drop.curve),
        **correction(late.curve),
        "threads": args.threads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="the run's seed")
    parser.add_argument("--late-share", type=float, default=0.3, help="share of RL sessions judged late")
    parser.add_argument("--late-after", type=int, default=2, help="iterations a late verdict waits")
    parser.add_argument("--rl-iterations", type=int, default=GRPO_ITERATIONS, help="GRPO iterations per arm")
    parser.add_argument("--eval-tasks", type=int, default=100, help="held-out test tasks per policy")
    parser.add_argument("--sft-steps", type=int, default=240, help="imitation steps (the demo's: 240)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-late"), help="run folders")
    parser.add_argument("--verbose", action="store_true", help="show the runs' own output on stderr")
    parser.add_argument("--jobs", type=int, default=1, help="2: run the two arms at once")
    parser.add_argument("--reuse", action="store_true", help="start from the imitation run in --out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    console = Console(stderr=True, quiet=not args.verbose)
    started = time.monotonic()

    # imitation once, gate passed, RL not started: both arms resume from a copy of it
    base = demo_config(
        args.out / "imitation",
        seed=args.seed,
        sft_steps=args.sft_steps,
        rl_iterations=0,
        rft_rounds=0,  # GRPO from the imitation policy, as this bench measured it
        eval_tasks=args.eval_tasks,
    )
    imitate(base, args.reuse, console)
    drop, late = arms(args, base)
    sft = drop.report["sft"]
    print(f"imitation: success {sft.metrics.success:.3f} on {sft.metrics.n_tasks} test tasks")
    print(f"drop late sessions: success {drop.report['rl'].metrics.success:.3f}")
    print(f"train on late sessions: success {late.report['rl'].metrics.success:.3f}")

    result = summary(args, drop, late)
    result["minutes"] = round((time.monotonic() - started) / 60, 2)
    result["imitation_reused"] = args.reuse  # then `minutes` leaves out the imitation run
    low, high = result["success_ci"]
    print(
        f"success {result['drop_success']:.3f} (drop) -> {result['late_success']:.3f} (late) on "
        f"{result['n_eval']} tasks: the late arm alone solved {result['late_only']}, the drop arm alone "
        f"{result['drop_only']}; exact McNemar p = {result['p_success']:.3g}; change 95% CI "
        f"[{low:+.3f}, {high:+.3f}]"
    )
    print(
        f"late sessions trained on: {result['late_trained']}; dropped in the other arm: {result['dropped']}; "
        f"tokens truncated {result['is_truncated']}, mean importance weight {result['is_weight']} "
        f"(updates with late sessions: {result['is_truncated_late_updates']}, "
        f"{result['is_weight_late_updates']})"
    )
    print(orjson.dumps(result).decode())


if __name__ == "__main__":
    main()
