"""Does the demo's RL gain hold? The demo's pipeline (`sessionrl demo`) for several seeds, paired by task.

Each seed runs the whole demo (demonstrations, imitation, GRPO, both policies evaluated greedily on the same
held-out test tasks) in its own run folder. Per seed it prints imitation and RL success, the tasks each
alone solved, the exact McNemar p and the TCSR change. Pooled over the seeds, every (seed, task) pair is one
paired trial, so the pooled exact McNemar test counts the discordant pairs of all seeds together.

Nothing here is tuned on the test tasks: the demo's recipe is fixed before this runs, and the test tasks
are only evaluated on.

`--model smollm2` runs the orders recipe for the real model instead (`examples/orders-smollm2-sft.yaml`,
`-rft.yaml` and `-grpo.yaml` joined into one `trainer: grpo` run: imitation, the gate, rejection sampling,
GRPO with dense credit and a curriculum), on seeds 0-2 by default, both policies on the test tasks. It
needs `make model`. Its acceptance asks for RL above imitation at every seed: `rl_above` counts those.

`--threads N` sets torch's intra-op threads for every seed (default 1). A change of thread count reorders
float sums as a change of machine does, so the gain should hold at `--threads 1` and `--threads 2` alike.
`--jobs N` runs N seeds at once, each in its own process with `--threads` threads.

`--rows FILE` appends each seed's JSON row to FILE as soon as the seed ends, so a bench that is stopped
early keeps the seeds it finished; run again with the same FILE, it reads the seeds found there (same
model, iterations, evaluation tasks and threads) instead of running them again.

Last line: one JSON object with `model`, `seeds`, `rl_wins` (seeds where RL success >= imitation
success), `rl_above` (seeds where it is higher), `mean_gain`, `pooled_p`, `minutes`, the per-turn tool
accuracy of each policy pooled over the seeds (`tool_acc_sft`, `tool_acc_rl`, and `tool_acc_ci`, the paired
interval of the change; `sessionrl.eval.tool_accuracy`), and the per-seed rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from sessionrl.cli.train import quiet_model_loading
from sessionrl.envs.base import Split
from sessionrl.eval.significance import mcnemar_p
from sessionrl.eval.tool_accuracy import pooled_change
from sessionrl.train.config import RunConfig, Trainer
from sessionrl.train.llm.demo import RL_ITERATIONS, demo_config, run_demo

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MODELS = ("tiny", "smollm2")
DEFAULT_SEEDS = {"tiny": [0, 1, 2, 3, 4], "smollm2": [0, 1, 2]}

HEADER = "seed  sft    rl     gain    rl_only sft_only p       tcsr_ci            dev rounds  dev rl  minutes"


def smollm2_config(run_dir: Path, *, seed: int, rl_iterations: int | None, eval_tasks: int) -> RunConfig:
    """The orders recipe for SmolLM2 as one `trainer: grpo` run: imitation as `orders-smollm2-sft.yaml`
    says, then (after the gate) the rejection-sampling rounds of `orders-smollm2-rft.yaml`, then the GRPO
    stage and reward rules of `orders-smollm2-grpo.yaml` (`rl_iterations` of it; None: the file's), both
    policies evaluated on the first `eval_tasks` test tasks. The examples stay the one statement of it."""
    sft, rft, grpo = (
        RunConfig.load(EXAMPLES / f"orders-smollm2-{stage}.yaml") for stage in ("sft", "rft", "grpo")
    )
    if rft.rft is None:
        raise ValueError("orders-smollm2-rft.yaml has no rft: section")
    rules = grpo.rewards.rules and EXAMPLES.parent / grpo.rewards.rules  # relative to the repository
    rl = grpo.rl.model_copy(
        update={
            "iterations": grpo.rl.iterations if rl_iterations is None else rl_iterations,
            "sampling": dataclasses.replace(grpo.rl.sampling, seed=seed),
        }
    )
    return sft.model_copy(
        update={
            "run_dir": run_dir,
            "seed": seed,
            "trainer": Trainer.GRPO,  # model_copy does not validate: the enum, not its value
            "rft": rft.rft.model_copy(update={"sampling": dataclasses.replace(rft.rft.sampling, seed=seed)}),
            "rl": rl,
            "rewards": grpo.rewards.model_copy(update={"rules": rules}),
            "evaluation": grpo.evaluation.model_copy(update={"split": Split.TEST, "tasks": eval_tasks}),
        }
    )


def one_seed(
    model: str, seed: int, folder: Path, rl_iterations: int | None, eval_tasks: int, quiet: bool
) -> dict[str, Any]:
    """The demo's summary for `seed` with `model`'s recipe, in a fresh run folder (its console output goes
    to stderr, or nowhere when `quiet`)."""
    run_dir = folder / model / f"seed-{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    if model == "smollm2":
        config = smollm2_config(run_dir, seed=seed, rl_iterations=rl_iterations, eval_tasks=eval_tasks)
    else:
        iterations = RL_ITERATIONS if rl_iterations is None else rl_iterations
        config = demo_config(run_dir, seed=seed, rl_iterations=iterations, eval_tasks=eval_tasks)
    return run_demo(config, Console(stderr=True, quiet=quiet))


def one_seed_alone(
    model: str,
    seed: int,
    folder: Path,
    rl_iterations: int | None,
    eval_tasks: int,
    quiet: bool,
    threads: int,
) -> dict[str, Any]:
    """`one_seed` in a worker process of its own, on `threads` torch threads."""
    quiet_model_loading(threads)
    return one_seed(model, seed, folder, rl_iterations, eval_tasks, quiet)


def table(rows: list[dict[str, Any]]) -> str:
    """The per-seed table as plain text."""
    lines = [HEADER]
    for r in rows:
        gain = r["rl_success"] - r["sft_success"]
        lines.append(
            f"{r['seed']:<5} {r['sft_success']:.3f}  {r['rl_success']:.3f}  {gain:+.3f}  "
            f"{r['rl_only']:<7} {r['sft_only']:<8} {r['p_success']:<7.3g} "
            f"[{r['tcsr_ci'][0]:+.3f}, {r['tcsr_ci'][1]:+.3f}]  {dev_judged(r, 'rft_dev'):<11} "
            f"{dev_judged(r, 'rl_dev'):<7} {r['minutes']:.1f}"
        )
    return "\n".join(lines)


def dev_judged(row: dict[str, Any], key: str) -> str:
    """What the dev tasks judged (`rft_dev`: the rejection-sampling rounds; `rl_dev`: GRPO's iterations),
    as dev successes in order with each undone one marked (`31 33 x32`: the first kept, the second
    undone), or `-` where none was judged."""
    verdicts = row.get(key) or []
    if not verdicts:
        return "-"
    return " ".join([str(verdicts[0][0])] + [("" if kept else "x") + str(n) for _, n, kept in verdicts])


def finished(args: argparse.Namespace) -> dict[int, dict[str, Any]]:
    """The rows `args.rows` already holds for the seeds asked for, run with the same budget, by seed."""
    if args.rows is None or not args.rows.is_file():
        return {}
    rows = [orjson.loads(line) for line in args.rows.read_bytes().splitlines() if line.strip()]
    return {
        r["seed"]: r
        for r in rows
        if r["seed"] in args.seeds
        and r.get("model", "tiny") == args.model
        and (args.rl_iterations is None or r["rl_iterations"] == args.rl_iterations)
        and r["n_eval"] == args.eval_tasks
        and r.get("threads") == args.threads
    }


def seed_rows(args: argparse.Namespace, seeds: list[int]) -> Iterator[dict[str, Any]]:
    """Each seed's demo summary as it ends: in this process one after another, or `args.jobs` at once."""
    run = (args.out, args.rl_iterations, args.eval_tasks, not args.verbose)
    seeds_of = [(args.model, seed) for seed in seeds]
    if args.jobs <= 1:
        quiet_model_loading(args.threads)
        for model, seed in seeds_of:
            yield one_seed(model, seed, *run)
        return
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(one_seed_alone, model, seed, *run, args.threads) for model, seed in seeds_of]
        for future in as_completed(futures):
            yield future.result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="tiny", help="the demo's tiny model, or SmolLM2")
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds to run (tiny: 0-4; smollm2: 0-2)")
    parser.add_argument(
        "--rl-iterations",
        type=int,
        help="GRPO iterations per seed, after rejection sampling (default: the recipe's)",
    )
    parser.add_argument("--eval-tasks", type=int, default=100, help="held-out test tasks per policy")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-learning"), help="run folders")
    parser.add_argument("--verbose", action="store_true", help="show each demo's own output on stderr")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per seed (intra-op)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at once, one process each")
    parser.add_argument("--rows", type=Path, help="append each seed's JSON row here as it ends")
    args = parser.parse_args()
    args.seeds = args.seeds or DEFAULT_SEEDS[args.model]

    started = time.monotonic()
    done = finished(args)
    rows = list(done.values())
    print(table(rows) if rows else HEADER, flush=True)
    for row in seed_rows(args, [seed for seed in args.seeds if seed not in done]):
        row["threads"], row["model"] = args.threads, args.model
        rows.append(row)
        print(table(rows).splitlines()[-1], flush=True)
        if args.rows is not None:
            with args.rows.open("ab") as out:
                out.write(orjson.dumps(row) + b"\n")
    rows.sort(key=lambda r: args.seeds.index(r["seed"]))
    gains = [r["rl_success"] - r["sft_success"] for r in rows]
    pooled = mcnemar_p(sum(r["sft_only"] for r in rows), sum(r["rl_only"] for r in rows))
    print(table(rows))
    print(
        f"RL >= imitation in {sum(g >= 0 for g in gains)} of {len(rows)} seeds; mean gain "
        f"{statistics.fmean(gains):+.3f}; pooled exact McNemar p = {pooled:.3g} "
        f"({(time.monotonic() - started) / 60:.1f} minutes)"
    )
    keep = ("seed", "sft_success", "rl_success", "p_success", "rl_only", "sft_only", "tcsr_ci", "minutes")
    summary = {
        "model": args.model,
        "seeds": len(rows),
        "rl_wins": sum(g >= 0 for g in gains),
        "rl_above": sum(g > 0 for g in gains),
        "mean_gain": round(statistics.fmean(gains), 4),
        "pooled_p": round(pooled, 6),
        "minutes": round((time.monotonic() - started) / 60, 1),
        "rl_iterations": rows[0]["rl_iterations"] if rows else args.rl_iterations,
        "eval_tasks": args.eval_tasks,
        "threads": args.threads,
        "rows": [{k: r[k] for k in keep} for r in rows],
    }
    summary |= pooled_tool_accuracy(rows)
    if "tool_acc_ci" in summary:
        print(
            f"per-turn tool accuracy, pooled over {summary['tool_acc_seeds']} seeds: imitation"
            f" {summary['tool_acc_sft']:.3f} -> RL {summary['tool_acc_rl']:.3f}, paired 95% CI of the change"
            f" {summary['tool_acc_ci']}"
        )
    print(orjson.dumps(summary).decode())


def pooled_tool_accuracy(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-turn tool accuracy pooled over the seeds that measured it, every (seed, task) a pair:
    `tool_acc_sft`, `tool_acc_rl`, `tool_acc_ci` (paired bootstrap over those pairs) and `tool_acc_seeds`;
    empty when no seed did (rows from an older --rows file)."""
    measured = [r for r in rows if "tool_counts" in r]
    pairs = [counts for r in measured for counts in r["tool_counts"].values()]
    if not pairs:
        return {}
    pooled = pooled_change([tuple(p[0]) for p in pairs], [tuple(p[1]) for p in pairs])
    return {
        "tool_acc_sft": pooled["first"],
        "tool_acc_rl": pooled["second"],
        "tool_acc_ci": pooled["ci"],
        "tool_acc_seeds": len(measured),
    }


if __name__ == "__main__":
    main()
