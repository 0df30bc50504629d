"""The three training stages on orders, `stages: [imitation, rl, reflection]`, and correction uplift.

The run is the demo's (`sessionrl.train.llm.demo.demo_config`: its tiny model, its imitation recipe of
240 steps on 400 expert sessions, GRPO with transient faults at 15%), with fewer GRPO iterations by
default (`--rl-iterations`; the demo runs 12), then reflection as stage 3
(`sessionrl.train.llm.reflection`): the RL policy's failures on `--reflect-tasks` training tasks it never
imitated are reflected on by the judge's offline extractor, and the expert's corrected retries with the
reflection in context are imitated (half of each batch, beside the demonstrations), with the root-cause
prediction loss weighted from 0.1 to 0.2.

CU is measured on held-out failures: the RL policy's failures among the first `--held-out` test tasks,
each retried once by the RL policy without a reflection and once by the reflection policy with it, on the
same seeds; `untrained_cu` is the RL policy's own retry with the reflection against without. Success of
each stage is on the first `--eval-tasks` test tasks (the same tasks and faults for every stage), and the
stages are compared task by task (exact McNemar p, bootstrap 95% interval of the change).

Prints the dimensions and levels tables after each stage and the paired comparisons; last line: one JSON
object with `cu`, `cu_p`, `cu_ci`, `held_out_failures`, `root_causes`, `retry_success_without`,
`retry_success_with`, `untrained_cu`, `untrained_cu_p`, `stage1_success`, `stage2_success`,
`stage3_success`, `stage3_vs_stage2_p`, `stage3_vs_stage2_ci`, `levels` and `minutes`. A second control
tells reading the reflection apart from the stage's training: the reflection policy retries the same
failures without a reflection (`retry_success_trained_without`), and `read_cu` (with `read_cu_p`,
`read_cu_ci`) is its success with the reflection minus without.

`--model smollm2` reflects on SmolLM2 instead: on the policy `--policy` names (by default the recipe's
GRPO policy, `runs/orders-smollm2-grpo/rl_policy`), as `examples/orders-smollm2-reflection.yaml` says
(its practice tasks, LoRA adapters, learning rate and steps, unless a flag gives them), reported on the
first `--eval-tasks` test tasks with CU on the first `--held-out`. Stage 2 is then that policy, and
`stage1_success` is absent.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

import orjson
import torch
from rich.console import Console

from sessionrl.envs.base import Split
from sessionrl.eval.report import dimensions_table, levels_table
from sessionrl.eval.significance import PairedComparison, paired_comparison
from sessionrl.train.config import ReflectionSection, RunConfig
from sessionrl.train.llm.demo import demo_config
from sessionrl.train.llm.reflection import StagesResult, success_by_task, train_stages
from sessionrl.train.llm.sft import SFTConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TINY_REFLECTION = {"reflect_tasks": 200, "reflection_steps": 80, "reflection_lr": 2e-3}
"""The tiny model's reflection flags when not given (SmolLM2's come from its example)."""


def staged_config(args: argparse.Namespace) -> RunConfig:
    """The demo's run with reflection as a third stage, at the flags' scale."""
    base = demo_config(args.run_dir, sft_steps=args.sft_steps, rl_iterations=args.rl_iterations)
    shape = {
        "hidden_size": args.hidden_size,
        "num_layers": args.layers,
        "intermediate_size": 4 * args.hidden_size,
    }
    model = base.model.model_copy(update={"tiny": dataclasses.replace(base.model.tiny, **shape)})
    flags = {k: v if (v := getattr(args, k)) is not None else d for k, d in TINY_REFLECTION.items()}
    trainer = SFTConfig(
        lr=flags["reflection_lr"], steps=flags["reflection_steps"], batch_sessions=8, token_budget=8192
    )
    return base.model_copy(
        update={
            "model": model,
            "stages": ("imitation", "rl", "reflection"),
            "evaluation": base.evaluation.model_copy(update={"tasks": args.eval_tasks}),
            "reflection": ReflectionSection(
                tasks=flags["reflect_tasks"], held_out=args.held_out, trainer=trainer
            ),
        }
    )


def smollm2_config(args: argparse.Namespace) -> RunConfig:
    """`examples/orders-smollm2-reflection.yaml` on the policy `--policy` names, reported on test tasks,
    with the flags that were given in place of the file's values."""
    base = RunConfig.load(EXAMPLES / "orders-smollm2-reflection.yaml")
    rc = base.reflection
    given = (("lr", args.reflection_lr), ("steps", args.reflection_steps))
    trainer = dataclasses.replace(rc.trainer, **{k: v for k, v in given if v is not None})
    tasks = rc.tasks if args.reflect_tasks is None else args.reflect_tasks
    return base.model_copy(
        update={
            "run_dir": args.run_dir,
            "model": base.model.model_copy(update={"path": args.policy}),
            "evaluation": base.evaluation.model_copy(update={"split": Split.TEST, "tasks": args.eval_tasks}),
            "reflection": rc.model_copy(
                update={"tasks": tasks, "held_out": args.held_out, "trainer": trainer}
            ),
        }
    )


def described(name: str, c: PairedComparison) -> str:
    """One line: the two rates, who alone solved what, McNemar's p and the interval of the change."""
    low, high = c.delta.as_list()
    return (
        f"{name}: {c.first_rate:.3f} -> {c.second_rate:.3f} on {c.tasks} tasks (first alone {c.first_only}, "
        f"second alone {c.second_only}); McNemar p = {c.p_value:.3g}; change {c.delta.estimate:+.3f}, "
        f"95% CI [{low:+.3f}, {high:+.3f}]"
    )


def summary(result: StagesResult, console: Console) -> dict[str, Any]:
    """The paired comparisons, printed, and the JSON summary's figures."""
    stage3 = result.stages[-1] if result.stages and result.stages[-1].stage == "reflection" else None
    # stage 2 is the policy reflection started from: the RL policy, or the loaded one (--model smollm2)
    before = result.stages[:-1] if stage3 is not None else result.stages
    stage2 = before[-1] if before else None
    stage1 = before[0] if len(before) > 1 else None
    out: dict[str, Any] = {
        f"stage{i}_success": None if r is None else r.metrics.success
        for i, r in enumerate((stage1, stage2, stage3), 1)
    }
    if stage2 is not None and stage3 is not None:
        stages = paired_comparison(success_by_task(stage2.sessions), success_by_task(stage3.sessions))
        console.print(described("success, stage 2 -> stage 3", stages), markup=False, highlight=False)
        out |= {"stage3_vs_stage2_p": round(stages.p_value, 6), "stage3_vs_stage2_ci": stages.delta.as_list()}
    uplift = result.uplift
    if uplift is not None and uplift.failures:
        cu = uplift.comparison()
        untrained = paired_comparison(
            success_by_task(uplift.without), success_by_task(uplift.untrained_with_reflection)
        )
        console.print(described("CU, retry without -> with reflection", cu), markup=False, highlight=False)
        console.print(described("untrained CU (stage 2 both)", untrained), markup=False, highlight=False)
        out |= {
            "cu": uplift.cu,
            "cu_p": round(cu.p_value, 6),
            "cu_ci": cu.delta.as_list(),
            "held_out_failures": uplift.failures,
            "root_causes": dict(uplift.causes),
            "retry_success_without": cu.first_rate,
            "retry_success_with": cu.second_rate,
            "untrained_cu": untrained.second_rate - untrained.first_rate,
            "untrained_cu_p": round(untrained.p_value, 6),
        }
        read = uplift.read()
        if read is not None:
            console.print(described("read CU (stage 3 both)", read), markup=False, highlight=False)
            out |= {
                "retry_success_trained_without": read.first_rate,
                "read_cu": read.second_rate - read.first_rate,
                "read_cu_p": round(read.p_value, 6),
                "read_cu_ci": read.delta.as_list(),
            }
    else:
        out |= {"cu": None, "held_out_failures": 0}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs/bench-reflection"))
    parser.add_argument("--hidden-size", type=int, default=128, help="the demo's model is 128 wide")
    parser.add_argument("--layers", type=int, default=4, help="the demo's model has 4 blocks")
    parser.add_argument("--sft-steps", type=int, default=240, help="the demo's imitation steps")
    parser.add_argument("--rl-iterations", type=int, default=4, help="the demo runs 12")
    parser.add_argument("--eval-tasks", type=int, default=100, help="the demo's held-out test tasks")
    parser.add_argument("--reflect-tasks", type=int, default=None, help="tiny: 200; smollm2: its example's")
    parser.add_argument("--held-out", type=int, default=100)
    parser.add_argument("--reflection-steps", type=int, default=None, help="tiny: 80; smollm2: its example's")
    parser.add_argument(
        "--reflection-lr", type=float, default=None, help="tiny: 2e-3; smollm2: its example's"
    )
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny", help="whose reflection")
    parser.add_argument(
        "--policy",
        type=Path,
        default=Path("runs/orders-smollm2-grpo/rl_policy"),
        help="smollm2: the policy to reflect on (the recipe's GRPO policy)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one on crowded cores)")
    parser.add_argument(
        "--resume", action="store_true", help="go on with the run in --run-dir: reflection runs again"
    )
    args = parser.parse_args()
    if args.model == "smollm2" and not args.policy.is_dir():
        parser.error(
            f"--policy {args.policy}: no policy folder there (train the recipe first: docs/recipe.md)"
        )
    torch.set_num_threads(args.threads)
    if not args.resume:
        shutil.rmtree(args.run_dir, ignore_errors=True)
    config = smollm2_config(args) if args.model == "smollm2" else staged_config(args)
    console = Console()
    started = time.monotonic()
    result = train_stages(config, resume=args.resume, console=console)
    title = f"orders · test · {args.eval_tasks} tasks"
    console.print(dimensions_table({r.stage: r.dimensions() for r in result.stages}, title=title))
    console.print(levels_table({r.stage: r.levels for r in result.stages}, title=f"{title} · levels"))
    figures = summary(result, console)
    figures["levels"] = {r.stage: r.levels.as_dict()["reached"] for r in result.stages}
    figures["model"] = args.model
    figures["minutes"] = round((time.monotonic() - started) / 60, 2)
    print(orjson.dumps(figures).decode())


if __name__ == "__main__":
    main()
