"""`sessionrl train <config.yaml>` and `sessionrl eval <run>`: train a policy, and measure one.

The training stack (torch, transformers) is imported when a command runs, so `sessionrl --help` and the
other commands stay quick."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.console import Console

from sessionrl.envs.base import Split


def train_command(
    config: Annotated[Path, typer.Argument(help="Run config (YAML); see examples/orders.yaml.")],
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the run's last checkpoint.")
    ] = False,
) -> None:
    """Imitation, a gate, then GRPO, as the config says, and the exported policies evaluated side by side;
    everything goes under its run_dir."""
    from sessionrl.cli.sessions import reporting
    from sessionrl.eval.report import metrics_table
    from sessionrl.train.config import RunConfig
    from sessionrl.train.llm.loop import train
    from sessionrl.train.llm.view import curve_table

    console = Console()
    run_config = RunConfig.load(config)
    with reporting():  # a named error (too few demonstrations, say) is one line and exit status 1
        result = train(run_config, resume=resume, console=console)
    if result.gate is not None:
        console.print(
            f"gate: success {result.gate.metrics.success:.3f} on {result.gate.metrics.n_tasks} tasks"
        )
    if result.curve:
        console.print(curve_table(result.curve))
    evaluation = run_config.evaluation
    columns = {label: e.metrics for label, e in result.report.items()}
    title = f"{run_config.env.name} · {evaluation.split} · {evaluation.tasks} tasks"
    console.print(metrics_table(columns, title=title))
    console.print(f"stage: {result.stage}; run folder: {run_config.run_dir}")


def eval_command(
    run: Annotated[Path, typer.Argument(help="Run folder (holding config.yaml and the exported policies).")],
    split: Annotated[Split | None, typer.Option(help="Split to evaluate on; default: the config's.")] = None,
    tasks: Annotated[int | None, typer.Option(help="How many tasks; default: the config's.")] = None,
) -> None:
    """Evaluate a run's exported policies (imitation and RL, where present) side by side."""
    from sessionrl.eval.report import metrics_table
    from sessionrl.train.config import RunConfig
    from sessionrl.train.llm.loop import evaluate_exported
    from sessionrl.train.llm.run import open_run

    console = Console()
    config = RunConfig.load(run / "config.yaml").model_copy(update={"run_dir": run})
    chosen_split = split or config.evaluation.split
    n_tasks = tasks or config.evaluation.tasks
    with open_run(config) as opened:
        report = evaluate_exported(opened, chosen_split, n_tasks, prefix=f"cli-{chosen_split}-")
    columns = {label: evaluation.metrics for label, evaluation in report.items()}
    if not columns:
        raise typer.BadParameter(f"{run} holds no exported policy (sft_policy/ or rl_policy/)")
    console.print(metrics_table(columns, title=f"{config.env.name} · {chosen_split} · {n_tasks} tasks"))
    console.print(orjson.dumps({k: m.as_dict() for k, m in columns.items()}).decode())
