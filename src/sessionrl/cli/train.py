"""`sessionrl train <config.yaml>` and `sessionrl eval <run>`: train a policy, and measure one.

The training stack (torch, transformers) is imported when a command runs, so `sessionrl --help` and the
other commands stay quick."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.console import Console

from sessionrl.envs.base import Split

if TYPE_CHECKING:
    from sessionrl.session import Session
    from sessionrl.train.config import RunConfig
    from sessionrl.train.llm.evaluation import Evaluation
    from sessionrl.train.llm.loop import TrainResult
    from sessionrl.train.llm.reflection import StagesResult
    from sessionrl.train.structured.run import StructuredResult


def train_command(
    config: Annotated[
        Path, typer.Argument(help="Run config (YAML); see examples/orders-<trainer>.yaml for each trainer.")
    ],
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Continue from the run's last checkpoint (sft, grpo and staged runs)."),
    ] = False,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            min=1,
            help="Torch CPU threads (default: torch's); at one, a seed's run is the same in every process.",
        ),
    ] = None,
) -> None:
    """Train what the config's `trainer:` names (sft, grpo, dpo, rft, ppo, aaac), then evaluate the exported
    policies side by side; everything goes under its run_dir. Exit status 1 when the gate stops a grpo
    run before reinforcement learning."""
    quiet_model_loading(threads)
    from sessionrl.cli.sessions import reporting
    from sessionrl.train.config import RunConfig
    from sessionrl.train.dispatch import run_trainer
    from sessionrl.train.llm.checkpoint import Stage
    from sessionrl.train.llm.loop import TrainResult
    from sessionrl.train.llm.reflection import StagesResult
    from sessionrl.train.structured.run import StructuredResult

    console = Console()
    run_config = RunConfig.load(config)
    plan = _plan(run_config)
    if plan:
        console.print(plan, soft_wrap=True)
    with reporting(), interrupted(run_config, config):  # a named error is one line and exit status 1
        result = run_trainer(run_config, resume=resume, console=console)
    evaluation = run_config.evaluation
    title = f"{run_config.env.name} · {evaluation.split} · {evaluation.tasks} tasks"
    staged = result if isinstance(result, StagesResult) else None
    trained = staged.train if staged is not None else result
    if isinstance(trained, StructuredResult):
        _print_structured(console, trained, title)
    elif isinstance(trained, TrainResult):
        _print_llm(console, trained, title)
    if staged is not None:
        _print_stages(console, staged, title)
    console.print(f"trainer: {run_config.trainer}; run folder: {run_config.run_dir}")
    if isinstance(trained, TrainResult) and trained.stage is Stage.STOPPED:
        _stopped_at_the_gate(trained, run_config)


def quiet_model_loading(threads: int | None) -> None:
    """Set torch's thread count (to torch's own when None: `sessionrl.train.threads`), and keep
    transformers' download and loading bars out of the run's log (the run prints its own progress)."""
    from transformers.utils import logging as hf_logging

    from sessionrl.train.threads import pin_threads

    pin_threads(threads)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


@contextmanager
def interrupted(config: RunConfig, path: Path) -> Iterator[None]:
    """Ctrl-C while training: say how to continue (`--resume` for the trainers that keep checkpoints)
    instead of a traceback, and exit with status 130."""
    from sessionrl.cli.sessions import err
    from sessionrl.train.dispatch import RESUMABLE

    try:
        yield
    except KeyboardInterrupt:
        if config.trainer in RESUMABLE:
            how = (
                f"`sessionrl train {path} --resume` continues from the last checkpoint in {config.run_dir}"
                " (imitation keeps one every 25 steps, RL one every iteration)"
            )
        else:
            how = f"trainer {config.trainer} keeps no checkpoint: run it again with a new run_dir"
        err.print(f"[yellow]interrupted.[/yellow] {how}", soft_wrap=True)
        raise typer.Exit(130) from None


def _plan(config: RunConfig) -> str:
    """What an sft or grpo run will do, stage by stage, so its length can be judged before it starts (each
    stage's progress then says how long it has left); empty for the other trainers."""
    sft, rl, evaluation = config.sft, config.rl, config.evaluation
    stages = [f"{sft.demos} expert demonstration{'' if sft.demos == 1 else 's'}"]
    if sft.trainer.steps or config.model.path is None:
        stages.append(f"{sft.trainer.steps} imitation steps")
    else:
        stages.append(f"no imitation (the policy of {config.model.path})")
    if config.trainer == "grpo":
        stages.append(f"a gate on {evaluation.gate_tasks} {evaluation.gate_split} tasks")
        if rl.iterations:
            stages.append(
                f"{rl.iterations} GRPO iterations of {rl.tasks_per_iteration} tasks x {rl.trainer.group_size}"
            )
    elif config.trainer != "sft":
        return ""
    stages.append(f"an evaluation of each policy on {evaluation.tasks} {evaluation.split} tasks")
    if config.stages is not None and "reflection" in config.stages:
        reflection = config.reflection
        stages.append(
            f"reflection on {reflection.tasks} training tasks' failures, {reflection.trainer.steps} steps,"
            f" and CU on {reflection.held_out} {evaluation.split} tasks"
        )
    return f"plan: {', then '.join(stages)}"


def _stopped_at_the_gate(result: TrainResult, config: RunConfig) -> None:
    """Say why the run stopped before reinforcement learning and what to try, and exit with status 1."""
    from sessionrl.cli.sessions import err

    bar = config.evaluation
    reached = f"{result.gate.metrics.success:.3f}" if result.gate is not None else "below the bar"
    err.print(
        f"[red]stopped at the gate:[/red] the imitation policy's success on {bar.gate_tasks} {bar.gate_split}"
        f" tasks was {reached}, under evaluation.gate_min_success {bar.gate_min_success}, so GRPO did not"
        " start (sft_policy/ is kept). Try more demonstrations (sft.demos) or imitation steps"
        " (sft.trainer.steps), a larger model, or a lower evaluation.gate_min_success, in a new run_dir.",
        soft_wrap=True,
    )
    raise typer.Exit(1)


def _print_llm(console: Console, result: TrainResult, title: str) -> None:
    """The GRPO curve (where there is one), the report's metrics and the stage reached (the gate's verdict
    was printed when the gate ran)."""
    from sessionrl.eval.report import metrics_table
    from sessionrl.train.llm.view import curve_table

    if result.curve:
        console.print(curve_table(result.curve))
    console.print(metrics_table({label: e.metrics for label, e in result.report.items()}, title=title))
    _print_tool_accuracy(console, result.report)
    paused = (
        " (RL stopped early: the policy collapsed; see pause_report.json)" if result.stage == "paused" else ""
    )
    console.print(f"stage: {result.stage}{paused}")


def _print_tool_accuracy(console: Console, report: Mapping[str, Evaluation]) -> None:
    """Each evaluated policy's per-turn tool accuracy, and its change against the first, where measured."""
    from sessionrl.eval.tool_accuracy import describe

    measured = {label: e.tools for label, e in report.items() if e.tools is not None}
    for line in describe(measured):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _print_stages(console: Console, result: StagesResult, title: str) -> None:
    """A staged run: the five dimensions and the levels after each stage, and the held-out uplift."""
    from sessionrl.eval.report import dimensions_table, levels_table

    console.print(dimensions_table({r.stage: r.dimensions() for r in result.stages}, title=title))
    console.print(levels_table({r.stage: r.levels for r in result.stages}, title=f"{title} · levels"))
    if result.uplift is not None:
        u = result.uplift
        if u.cu is None:
            console.print("CU: no held-out failures to retry")
            return
        low, high = u.comparison().delta.as_list()
        console.print(
            f"CU on {u.failures} held-out failures: {u.cu:+.3f}, 95% CI [{low:+.3f}, {high:+.3f}]"
            f" (McNemar p={u.p_value:.3f})"
        )
        if (read := u.read()) is not None:
            low, high = read.delta.as_list()
            console.print(
                f"reading the reflection: {read.delta.estimate:+.3f}, 95% CI [{low:+.3f}, {high:+.3f}]"
                f" (the reflection policy's retries with it, {read.second_rate:.3f}, against without,"
                f" {read.first_rate:.3f}; McNemar p={read.p_value:.3f})"
            )


def _print_structured(console: Console, result: StructuredResult, title: str) -> None:
    """The last round's training completion and the report's summaries."""
    from sessionrl.train.structured.run import summary_table

    if result.history:
        last = result.history[-1]
        console.print(
            f"{result.trainer}: {len(result.history)} rounds, {last.env_steps} steps, training completion"
            f" {last.train.completion:.3f} in the last round"
        )
    console.print(summary_table(result.report, title))


def eval_command(
    run: Annotated[Path, typer.Argument(help="Run folder (holding config.yaml and the exported policies).")],
    split: Annotated[Split | None, typer.Option(help="Split to evaluate on; default: the config's.")] = None,
    tasks: Annotated[int | None, typer.Option(help="How many tasks; default: the config's.")] = None,
    levels: Annotated[
        bool,
        typer.Option(
            "--levels", help="Report capability levels L1-L5 from the run's stored sessions instead."
        ),
    ] = False,
) -> None:
    """Evaluate a run's exported policies side by side: imitation, GRPO and DPO for an LLM run, imitation
    and the trainer's for a structured (ppo, aaac) one. With --levels, run nothing: judge the levels, pass
    or fail, of the sessions the run stored, by evaluation label."""
    from sessionrl.eval.report import metrics_table
    from sessionrl.train.config import RunConfig
    from sessionrl.train.llm.evaluation import evaluate_exported
    from sessionrl.train.llm.run import open_run
    from sessionrl.train.structured.run import STRUCTURED

    console = Console()
    config = RunConfig.load(run / "config.yaml").model_copy(update={"run_dir": run})
    chosen_split = split or config.evaluation.split
    n_tasks = tasks or config.evaluation.tasks
    title = f"{config.env.name} · {chosen_split} · {n_tasks} tasks"
    if levels:
        _stored_levels(console, config)
        return
    if config.trainer in STRUCTURED:
        _eval_structured(console, config, chosen_split, n_tasks, title)
        return
    quiet_model_loading(None)
    with open_run(config) as opened:
        report = evaluate_exported(opened, chosen_split, n_tasks, prefix=f"cli-{chosen_split}-")
    columns = {label: evaluation.metrics for label, evaluation in report.items()}
    if not columns:
        raise typer.BadParameter(f"{run} holds no exported policy (sft_policy/, rl_policy/ or dpo_policy/)")
    console.print(metrics_table(columns, title=title))
    _print_tool_accuracy(console, report)
    line = {k: e.metrics.as_dict() | (e.tools.as_dict() if e.tools else {}) for k, e in report.items()}
    typer.echo(orjson.dumps(line).decode())


def _eval_structured(console: Console, config: RunConfig, split: Split, n_tasks: int, title: str) -> None:
    """A structured run's exported policies, evaluated greedily: a table, then one JSON line."""
    from sessionrl.train.structured.run import evaluate_exported, summary_table

    report = evaluate_exported(config, split, n_tasks)
    if not report:
        raise typer.BadParameter(
            f"{config.run_dir} holds no exported policy (imitation_policy/ or {config.trainer}_policy/)"
        )
    console.print(summary_table(report, title))
    typer.echo(orjson.dumps({k: dataclasses.asdict(s) for k, s in report.items()}).decode())


def _stored_levels(console: Console, config: RunConfig) -> None:
    """The levels of a run's stored sessions, one column per label (`metadata.label`, else the stage) and
    one for them all: a table, then one JSON line."""
    from sessionrl.eval.curriculum import expert_steps
    from sessionrl.eval.levels import assess
    from sessionrl.eval.report import levels_table
    from sessionrl.store import SessionStore

    with SessionStore.open(config.store_url) as store:
        groups: dict[str, list[Session]] = {}
        for session in store.iter_sessions():
            label = session.metadata.get("label") or session.metadata.get("stage") or "unlabelled"
            groups.setdefault(str(label), []).append(session)
    if not groups:
        raise typer.BadParameter(f"{config.run_dir} holds no stored session")
    if len(groups) > 1:  # retries with and without a reflection carry different labels: L5 pairs them here
        groups["all"] = [session for sessions in groups.values() for session in sessions]
    steps = expert_steps(config.env.build())
    reports = {label: assess(sessions, config.levels, steps_of=steps) for label, sessions in groups.items()}
    console.print(levels_table(reports, title=f"{config.env.name} · capability levels"))
    full = config.run_dir / "levels.json"
    full.write_bytes(
        orjson.dumps({label: r.as_dict() for label, r in reports.items()}, option=orjson.OPT_INDENT_2)
    )
    console.print(f"each level's evidence: {full}")
    typer.echo(orjson.dumps({label: _brief(r.as_dict()) for label, r in reports.items()}).decode())


def _brief(report: dict[str, object]) -> dict[str, object]:
    """A level report without each level's evidence (`detail`, kilobytes of it), for the one JSON line."""
    return {
        key: {k: v for k, v in value.items() if k != "detail"} if isinstance(value, dict) else value
        for key, value in report.items()
    }
