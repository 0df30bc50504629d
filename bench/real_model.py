"""A real pretrained model through the whole path: SmolLM2-135M-Instruct on τ-bench retail and on orders.

For each domain, from `examples/retail-smollm2.yaml` (the file `sessionrl train` runs), in stages:

1. zero-shot: the model as shipped, evaluated greedily on the test tasks;
2. SFT: LoRA imitation of expert sessions recorded on the training tasks (all of them recorded);
3. GRPO on training tasks, after the gate;
4. the SFT and the RL policy each evaluated on the same test tasks as zero-shot.

Every evaluation reports task success, TCSR, ER@5, SPT, the failure attribution and the per-turn tool
accuracy (teacher-forced on the expert's trajectory of each test task: right tool, exact arguments,
parsed; `sessionrl.eval.tool_accuracy`). Everything lands
under `--out` (one run folder per domain and stage); a finished stage writes `<stage>.json`, and
`--resume` continues an interrupted bench from there: finished stages are read back, an interrupted
training run resumes from its checkpoint, and evaluation episodes already judged are not run again.

The full bench (115 test tasks, 500 demonstrations) takes hours on 2 cores; `--limit` runs every stage
small (`--limit 5` evaluates 5 test tasks, imitates 16 demonstrations for 8 steps, runs one GRPO
iteration of 2 tasks x 2). The flags after it set each size alone. The time each stage took is printed,
from the run's own metrics log.

Last line: one JSON object with `retail_zero_shot`, `retail_sft`, `retail_rl`, `retail_sft_tcsr`,
`retail_rl_tcsr`, `orders_zero_shot`, `orders_sft`, `orders_rl` (task success), the tool accuracy of each
(`retail_tool_acc_sft`, `retail_tool_acc_rl`, ..., and `<env>_tool_acc_ci`, the paired interval of the
change from imitation to RL over tasks), `<env>_p_success` with `<env>_sft_only` and `<env>_rl_only` (exact
McNemar on task success, imitation against RL, over the tasks both evaluated), `minutes` and the sizes run.
`--seed` runs another seed of the example (its own, 0, by default).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import orjson
import torch
from rich.console import Console

from sessionrl.envs.base import Split
from sessionrl.episodes.verdict import task_success
from sessionrl.eval.metrics import AgentMetrics
from sessionrl.eval.report import metrics_table
from sessionrl.eval.significance import paired_comparison
from sessionrl.eval.tool_accuracy import pooled_change
from sessionrl.train.config import EnvSection, RunConfig
from sessionrl.train.llm.evaluation import Evaluation, evaluate
from sessionrl.train.llm.loop import train
from sessionrl.train.llm.run import build_policy, open_run

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "retail-smollm2.yaml"
# the bench evaluates every test task unless told otherwise (retail's split has 115, the larger; an
# evaluation takes at most its split); the example evaluates 20 of them to fit two cores
TEST_TASKS = 115
STAGES = ("zero_shot", "sft", "rl")


def sized(base: RunConfig, env: str, out: Path, args: argparse.Namespace) -> RunConfig:
    """The example's run for `env` under `out/env`, at the sizes the flags ask for."""
    options = {"data": args.data} if env == "retail" and args.data else {}
    domain = EnvSection(name=env, options=options)
    seed = base.seed if args.seed is None else args.seed
    cfg = base.model_copy(update={"run_dir": out / env / "train", "env": domain, "seed": seed})
    sft, rl, evaluation = cfg.sft, cfg.rl, cfg.evaluation
    sft = sft.model_copy(
        update={
            "demos": args.demos or demonstrable(domain, sft.demos),
            "trainer": dataclasses.replace(
                sft.trainer,
                steps=args.sft_steps or sft.trainer.steps,
                batch_sessions=args.sft_batch or sft.trainer.batch_sessions,
                lr=args.sft_lr or sft.trainer.lr,
                warmup_steps=min(
                    sft.trainer.warmup_steps, max((args.sft_steps or sft.trainer.steps) // 4, 1)
                ),
            ),
        }
    )
    rl = rl.model_copy(
        update={
            "iterations": args.rl_iterations if args.rl_iterations is not None else rl.iterations,
            "tasks_per_iteration": args.rl_tasks or rl.tasks_per_iteration,
            "trainer": dataclasses.replace(rl.trainer, group_size=args.group or rl.trainer.group_size),
        }
    )
    rollout = cfg.rollout
    if args.prompt is not None:
        rollout = dataclasses.replace(
            rollout, full_schemas=args.prompt == "full", domain_policy=args.prompt != "short"
        )
    if args.max_new_tokens is not None:
        evaluation = evaluation.model_copy(update={"max_new_tokens": args.max_new_tokens})
        sampling = dataclasses.replace(rl.sampling, max_new_tokens=args.max_new_tokens)
        rl = rl.model_copy(update={"sampling": sampling})
    evaluation = evaluation.model_copy(
        update={
            "tasks": args.eval_tasks or TEST_TASKS,
            "gate_tasks": args.gate_tasks or evaluation.gate_tasks,
        }
    )
    return RunConfig.model_validate(
        cfg.model_copy(
            update={"sft": sft, "rl": rl, "evaluation": evaluation, "rollout": rollout}
        ).model_dump()
    )


def demonstrable(domain: EnvSection, wanted: int) -> int:
    """The example's demonstration count, or fewer where the domain has fewer training tasks (`orders` has
    400 to retail's 500): one demonstration a task, all of them recorded, none asked for that cannot be."""
    return min(wanted, len(domain.build().tasks(Split.TRAIN)))


def zero_shot(cfg: RunConfig) -> Evaluation:
    """The shipped model (no adapters) on the evaluation's test tasks, in its own run folder, with its
    tool accuracy."""
    cfg = cfg.model_copy(update={"run_dir": cfg.run_dir.parent / "zero_shot"})
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"lora": None})})
    with open_run(cfg) as run:
        run.policy = build_policy(cfg, [], run.folder / "base")
        split, n = cfg.evaluation.split, cfg.evaluation.tasks
        return evaluate(run, run.policy, split, n, "zero_shot", tools=True)


def saved(evaluation: Evaluation) -> dict[str, Any]:
    """What `<stage>.json` keeps: the metrics, each task's success, the tool accuracy's keys and its
    per-task counts."""
    tools = evaluation.tools
    accuracy = {} if tools is None else tools.as_dict() | {"tool_counts": tools.by_task()}
    solved = {str(s.metadata["task_id"]): task_success(s) is True for s in evaluation.sessions}
    return evaluation.metrics.as_dict() | {"solved": solved} | accuracy


def timeline(run_dir: Path, since: float) -> list[tuple[str, float]]:
    """When each stage of a training run finished its work, in seconds after `since`, from metrics.jsonl:
    the demonstrations, the last imitation step, each evaluation, the last RL iteration."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    marks: dict[str, float] = {}
    for line in path.read_bytes().splitlines():
        record = orjson.loads(line)
        label = record["stage"] if record["stage"] != "eval" else f"eval {record.get('label')}"
        marks[label] = record["time"] - since
    return sorted(marks.items(), key=lambda item: item[1])


def metrics_from(data: dict[str, Any]) -> AgentMetrics:
    """An evaluation's metrics back from `AgentMetrics.as_dict`."""
    pass_k = {int(k.split("^")[1]): v for k, v in data.items() if k.startswith("pass^")}
    fields = ("n_sessions", "n_tasks", "success", "tcsr", "dvr", "er5", "spt", "failures")
    return AgentMetrics(pass_k=pass_k, **{f: data[f] for f in fields})


def run_domain(cfg: RunConfig, folder: Path, resume: bool, console: Console) -> dict[str, dict[str, Any]]:
    """Zero-shot, then SFT and GRPO, for one domain; each stage's record (`saved`) written once finished."""
    results: dict[str, dict[str, Any]] = {}
    files = {s: folder / f"{s}.json" for s in STAGES}
    if resume and files["zero_shot"].exists():
        results["zero_shot"] = orjson.loads(files["zero_shot"].read_bytes())
    else:
        started = time.time()
        results["zero_shot"] = saved(zero_shot(cfg))
        files["zero_shot"].write_bytes(orjson.dumps(results["zero_shot"]))
        console.print(f"{cfg.env.name} zero-shot: {time.time() - started:.0f} s")
    if resume and files["sft"].exists():
        results["sft"] = orjson.loads(files["sft"].read_bytes())
        if files["rl"].exists():
            results["rl"] = orjson.loads(files["rl"].read_bytes())
        return results
    started = time.time()
    trained = train(cfg, resume=resume and (cfg.run_dir / "sessions.db").exists(), console=console)
    for label in ("sft", "rl"):
        if label in trained.report:
            results[label] = saved(trained.report[label])
            files[label].write_bytes(orjson.dumps(results[label]))
    for label, seconds in timeline(cfg.run_dir, started):
        console.print(f"  {cfg.env.name} {label:<18} done at {seconds:7.0f} s")
    return results


def tool_keys(env: str, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`<env>_tool_acc_<stage>` for every stage that measured it, and `<env>_tool_acc_ci`: the paired
    interval (over tasks) of the change from imitation to RL."""
    keys = {f"{env}_tool_acc_{stage}": r["tool_acc"] for stage, r in results.items() if "tool_acc" in r}
    sft, rl = results.get("sft", {}).get("tool_counts"), results.get("rl", {}).get("tool_counts")
    if sft and rl:
        common = sorted(sft.keys() & rl.keys())
        keys[f"{env}_tool_acc_ci"] = pooled_change([sft[t] for t in common], [rl[t] for t in common])["ci"]
    return keys


def success_keys(env: str, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`<env>_p_success`, `<env>_sft_only` and `<env>_rl_only`: imitation against RL on task success over
    the tasks both evaluated (exact McNemar); nothing when either stage's record lacks its tasks."""
    sft, rl = results.get("sft", {}).get("solved"), results.get("rl", {}).get("solved")
    if not (sft and rl):
        return {}
    paired = paired_comparison(sft, rl)
    return {
        f"{env}_p_success": round(paired.p_value, 6),
        f"{env}_sft_only": paired.first_only,
        f"{env}_rl_only": paired.second_only,
    }


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/real_model"), help="where the runs go")
    parser.add_argument("--data", default=os.environ.get("SESSIONRL_RETAIL_DATA"), help="retail data folder")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted bench in --out")
    parser.add_argument("--envs", default="retail,orders", help="domains, comma-separated")
    parser.add_argument("--seed", type=int, default=None, help="the runs' seed (the example's by default)")
    parser.add_argument("--limit", type=int, default=None, help="run small: this many test tasks (see doc)")
    parser.add_argument("--eval-tasks", type=int, default=None, help="test tasks per evaluation")
    parser.add_argument("--gate-tasks", type=int, default=None, help="dev tasks of the gate")
    parser.add_argument("--demos", type=int, default=None, help="expert demonstrations recorded")
    parser.add_argument("--sft-steps", type=int, default=None, help="imitation optimiser steps")
    parser.add_argument("--sft-batch", type=int, default=None, help="demonstrations per imitation step")
    parser.add_argument("--sft-lr", type=float, default=None, help="imitation learning rate")
    parser.add_argument("--rl-iterations", type=int, default=None, help="GRPO iterations")
    parser.add_argument("--rl-tasks", type=int, default=None, help="training tasks per GRPO iteration")
    parser.add_argument("--group", type=int, default=None, help="episodes per task in GRPO (K)")
    parser.add_argument(
        "--prompt",
        choices=["full", "brief", "short"],
        default=None,
        help="system prompt: policy + full schemas, policy + signatures, signatures alone (the example)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=None, help="longest reply, in tokens")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (0: torch's default; 1 on a crowded machine)"
    )
    args = parser.parse_args()
    if args.limit is not None:
        small = {"eval_tasks": args.limit, "gate_tasks": 2, "demos": 16, "sft_steps": 8, "sft_batch": 4}
        small |= {"rl_iterations": 1, "rl_tasks": 2, "group": 2}
        for name, value in small.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    return args


def main() -> None:
    args = arguments()
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console()
    if args.out.exists() and not args.resume:
        raise SystemExit(f"{args.out} holds an earlier bench: --resume it, or choose another --out")
    started = time.monotonic()
    base = RunConfig.load(EXAMPLE)
    summary: dict[str, Any] = {}
    for env in args.envs.split(","):
        cfg = sized(base, env, args.out, args)
        (args.out / env).mkdir(parents=True, exist_ok=True)
        console.rule(f"{env}: {cfg.evaluation.tasks} test tasks, {cfg.sft.demos} demonstrations")
        results = run_domain(cfg, args.out / env, args.resume, console)
        metrics = {stage: metrics_from(r) for stage, r in results.items()}
        console.print(
            metrics_table(metrics, title=f"{env}, SmolLM2-135M-Instruct, {cfg.evaluation.tasks} test tasks")
        )
        for stage, m in metrics.items():
            summary[f"{env}_{stage}"] = m.success
            summary[f"{env}_{stage}_tcsr"] = m.tcsr
        paired = tool_keys(env, results) | success_keys(env, results)
        summary |= paired
        for key, value in paired.items():
            console.print(f"  {key}: {value}")
        summary[f"{env}_sizes"] = {
            "eval_tasks": cfg.evaluation.tasks,
            "demos": cfg.sft.demos,
            "sft_steps": cfg.sft.trainer.steps,
            "rl_iterations": cfg.rl.iterations,
            "rl_episodes": cfg.rl.tasks_per_iteration * cfg.rl.trainer.group_size,
            "seed": cfg.seed,
        }
        summary[f"{env}_failures"] = {stage: m.failures for stage, m in metrics.items()}
    summary["minutes"] = round((time.monotonic() - started) / 60, 2)
    summary["split"] = Split.TEST.value
    print(orjson.dumps(summary).decode(), flush=True)


if __name__ == "__main__":
    main()
