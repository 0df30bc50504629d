"""The three training stages on orders, `stages: [imitation, rl, reflection]`, and correction uplift.

The run is the demo's (`sessionrl.train.llm.demo.demo_config`: tiny model, a small imitation budget, a
few minutes of GRPO with transient faults), shrunk by the flags (by default to a few minutes on 2 cores:
too small for the policy to learn much), with reflection as stage 3
(`sessionrl.train.llm.reflection`): the RL policy's failures on training tasks are reflected on by the
offline extractor, the expert's corrected retries with the reflection in context are imitated, with the
root-cause prediction loss weighted from 0.1 to 0.2.

CU is measured on held-out failures: the RL policy's failures among the first `--held-out` test tasks,
each retried once by the RL policy without a reflection and once by the reflection policy with it, on
the same seeds. `stage2_success` and `stage3_success` are the RL and reflection policies' success on the
first `--eval-tasks` test tasks (the same tasks and faults).

Prints the dimensions and levels tables after each stage; last line: one JSON object with `cu`,
`cu_p`, `held_out_failures`, `stage1_success`, `stage2_success`, `stage3_success`, `untrained_cu`,
`levels` and `minutes`.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import time
from pathlib import Path

import orjson
from rich.console import Console

from sessionrl.eval.metrics import success_rate
from sessionrl.eval.report import dimensions_table, levels_table
from sessionrl.train.config import EvalSection, ReflectionSection
from sessionrl.train.llm.demo import demo_config
from sessionrl.train.llm.reflection import train_stages
from sessionrl.train.llm.sft import SFTConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs/bench-reflection"))
    parser.add_argument("--hidden-size", type=int, default=64, help="the demo's model is 128 wide")
    parser.add_argument("--layers", type=int, default=2, help="the demo's model has 4 blocks")
    parser.add_argument("--sft-steps", type=int, default=80)
    parser.add_argument("--rl-iterations", type=int, default=4)
    parser.add_argument("--eval-tasks", type=int, default=16)
    parser.add_argument("--reflect-tasks", type=int, default=24)
    parser.add_argument("--held-out", type=int, default=16)
    parser.add_argument("--reflection-steps", type=int, default=30)
    args = parser.parse_args()
    shutil.rmtree(args.run_dir, ignore_errors=True)
    base = demo_config(args.run_dir, sft_steps=args.sft_steps, rl_iterations=args.rl_iterations)
    tiny = base.model.tiny
    shape = {
        "hidden_size": args.hidden_size,
        "num_layers": args.layers,
        "intermediate_size": 4 * args.hidden_size,
    }
    model = base.model.model_copy(update={"tiny": dataclasses.replace(tiny, **shape)})
    config = base.model_copy(
        update={
            "model": model,
            "stages": ("imitation", "rl", "reflection"),
            "evaluation": EvalSection(split=base.evaluation.split, tasks=args.eval_tasks, gate_tasks=10),
            "reflection": ReflectionSection(
                tasks=args.reflect_tasks,
                held_out=args.held_out,
                trainer=SFTConfig(lr=2e-3, steps=args.reflection_steps, batch_sessions=8, token_budget=8192),
            ),
        }
    )
    console = Console()
    started = time.monotonic()
    result = train_stages(config, console=console)
    minutes = (time.monotonic() - started) / 60
    title = f"orders · test · {args.eval_tasks} tasks"
    console.print(dimensions_table({r.stage: r.dimensions() for r in result.stages}, title=title))
    console.print(levels_table({r.stage: r.levels for r in result.stages}, title=f"{title} · levels"))
    success = {r.stage: r.metrics.success for r in result.stages}
    uplift = result.uplift
    summary = {
        "cu": uplift.cu if uplift is not None else None,
        "cu_p": uplift.p_value if uplift is not None else None,
        "held_out_failures": uplift.failures if uplift is not None else 0,
        "retry_success_without": success_rate(uplift.without) if uplift and uplift.without else None,
        "retry_success_with": success_rate(uplift.with_reflection) if uplift and uplift.failures else None,
        "untrained_cu": (
            success_rate(uplift.untrained_with_reflection) - success_rate(uplift.without)
            if uplift is not None and uplift.failures
            else None
        ),
        "stage1_success": success.get("imitation"),
        "stage2_success": success.get("rl"),
        "stage3_success": success.get("reflection"),
        "levels": {r.stage: r.levels.as_dict()["reached"] for r in result.stages},
        "minutes": round(minutes, 2),
    }
    print(orjson.dumps(summary).decode())


if __name__ == "__main__":
    main()
