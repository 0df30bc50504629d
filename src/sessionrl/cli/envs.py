"""`sessionrl envs ...`: list and inspect the built-in task environments, run scripted plans into the store.

`run-expert` and `replay-gold` end with one JSON line (`env`, `split`, `agent`, `n`, `successes`,
`success_rate`, `failed`), so scripts can read the result from the last line of the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.markup import escape
from rich.table import Table

from sessionrl.cli.sessions import DEFAULT_DB, Db, err, open_store, out, reporting
from sessionrl.envs import DecisionEnv, Split, Task
from sessionrl.envs.clinic import ClinicEnv
from sessionrl.envs.orders import OrdersEnv
from sessionrl.envs.retail import DATA_ENV_VAR, RetailDataMissing, RetailEnv, resolve_data_dir
from sessionrl.envs.runner import Agent, RunSummary, run_many
from sessionrl.skills import SkillContract

POLICY_LINES = 12
"""Lines of the domain policy `show` prints."""


class BuiltIn(StrEnum):
    """The environments that ship with sessionrl."""

    RETAIL = "retail"
    ORDERS = "orders"
    CLINIC = "clinic"


EnvName = Annotated[BuiltIn, typer.Argument(help="A built-in environment.", show_default=False)]
DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data",
        help=f"The τ-bench retail data folder [default: ${DATA_ENV_VAR}]",
        show_default=False,
        file_okay=False,
    ),
]
SplitOpt = Annotated[Split, typer.Option("--split", help="Which tasks: train, dev or test.")]
CountOpt = Annotated[int | None, typer.Option("--n", min=1, help="Run the first N tasks [default: all].")]
ConcurrencyOpt = Annotated[int, typer.Option(min=1, help="Episodes in flight at once.")]
SeedOpt = Annotated[int, typer.Option(help="Seeds every episode (each task draws its own seed from it).")]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar on stderr.")]

app = typer.Typer(help="List, inspect and run the built-in task environments.", no_args_is_help=True)


def load_env(name: BuiltIn, data: Path | None) -> DecisionEnv:
    """Build the environment `name`; retail reads `data` (or `$SESSIONRL_RETAIL_DATA`)."""
    if name is BuiltIn.RETAIL:
        return RetailEnv(resolve_data_dir(data))
    if name is BuiltIn.ORDERS:
        return OrdersEnv()
    return ClinicEnv()


def _load_or_exit(name: BuiltIn, data: Path | None) -> DecisionEnv:
    """`load_env`, or a one-line error saying how to get the retail data, and exit status 1."""
    try:
        return load_env(name, data)
    except RetailDataMissing as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from exc


@app.command("list")
def list_envs(data: DataDir = None) -> None:
    """The built-in environments with their skills and task counts per split."""
    table = Table(title="built-in environments")
    for column in ("env", "skills", *Split, "note"):
        table.add_column(column, justify="right" if column in ("skills", *Split) else "left")
    for name in BuiltIn:
        try:
            env = load_env(name, data)
        except RetailDataMissing:
            how = f"no data: pass --data DIR or set {DATA_ENV_VAR}"
            table.add_row(name.value, "-", *("-" for _ in Split), how)
            continue
        counts = (str(len(env.tasks(split))) for split in Split)
        table.add_row(name.value, str(len(env.contracts())), *counts, "")
    out.print(table)


@app.command("show")
def show(env_name: EnvName, data: DataDir = None) -> None:
    """An environment's skill contracts, the start of its policy, and a sample task with the expert's plan."""
    env = _load_or_exit(env_name, data)
    counts = ", ".join(f"{len(env.tasks(split))} {split}" for split in Split)
    out.print(f"[bold]{env.name}[/bold]: {len(env.contracts())} skills; tasks: {counts}")
    out.print(_contracts_table(env.contracts()))
    lines = env.system_prompt().strip().splitlines()
    out.rule("policy")
    out.print(escape("\n".join(lines[:POLICY_LINES])))
    if len(lines) > POLICY_LINES:
        out.print(f"[dim]… {len(lines) - POLICY_LINES} more lines[/dim]")
    train = env.tasks(Split.TRAIN)
    if train:
        _show_task(env, train[0])


def _contracts_table(contracts: Sequence[SkillContract]) -> Table:
    table = Table(title="skills (* required parameter)")
    table.add_column("skill", no_wrap=True)
    for column in ("risk", "parameters", "description"):
        table.add_column(column, overflow="fold")
    for contract in contracts:
        schema = contract.input_schema
        required = set(schema.get("required", ()))
        params = ", ".join(f"{p}*" if p in required else p for p in schema.get("properties", {}))
        summary = contract.description.strip().split(". ")[0]
        table.add_row(contract.name, contract.risk.value, escape(params), escape(summary))
    return table


def _show_task(env: DecisionEnv, task: Task) -> None:
    plan = env.expert(task)
    out.rule(f"sample task {task.task_id}")
    out.print(escape(task.instruction))
    table = Table(title=f"expert plan: {escape(plan.goal)}")
    for column in ("step", "tool", "params", "after"):
        table.add_column(column, overflow="fold")
    for step in plan.steps:
        params = orjson.dumps(dict(step.params)).decode()
        table.add_row(step.id, step.tool, escape(params), ", ".join(step.depends_on))
    out.print(table)
    out.print(f"[bold]final message:[/bold] {escape(plan.final_message)}")


@app.command("run-expert")
def run_expert(
    env_name: EnvName,
    split: SplitOpt = Split.TRAIN,
    n: CountOpt = None,
    db: Db = DEFAULT_DB,
    data: DataDir = None,
    concurrency: ConcurrencyOpt = 16,
    seed: SeedOpt = 0,
    progress: ProgressOpt = True,
) -> None:
    """Run the expert through the orchestrator on a split's tasks into the store; print the success rate."""
    env = _load_or_exit(env_name, data)
    _run(env, "expert", split, n, db=db, concurrency=concurrency, seed=seed, progress=progress)


@app.command("replay-gold")
def replay_gold(
    env_name: EnvName,
    split: SplitOpt = Split.TEST,
    n: CountOpt = None,
    db: Db = DEFAULT_DB,
    data: DataDir = None,
    concurrency: ConcurrencyOpt = 16,
    seed: SeedOpt = 0,
    progress: ProgressOpt = True,
) -> None:
    """Replay the tasks' gold actions (τ-bench style; retail only) through the orchestrator into the store."""
    if env_name is not BuiltIn.RETAIL:
        err.print(
            f"[red]error:[/red] {env_name.value} has no gold actions; only retail's τ-bench tasks have them"
        )
        raise typer.Exit(1)
    env = _load_or_exit(env_name, data)
    _run(env, "gold", split, n, db=db, concurrency=concurrency, seed=seed, progress=progress)


def _run(
    env: DecisionEnv,
    agent: Agent,
    split: Split,
    n: int | None,
    *,
    db: str,
    concurrency: int,
    seed: int,
    progress: bool,
) -> None:
    """Run, then print a sentence and the summary as one JSON line."""
    with reporting(), open_store(db) as store:
        summary = run_many(
            env, split, n, store=store, concurrency=concurrency, seed=seed, agent=agent, progress=progress
        )
    _report(summary)


def _report(summary: RunSummary) -> None:
    out.print(
        f"{summary.agent} on {summary.env} {summary.split}: {summary.successes} of {summary.n} solved "
        f"(success rate {summary.success_rate:.3f})",
        soft_wrap=True,
    )
    if summary.failed:
        shown = ", ".join(summary.failed[:10])
        more = f" and {len(summary.failed) - 10} more" if len(summary.failed) > 10 else ""
        out.print(f"failed: {shown}{more}", soft_wrap=True)
    typer.echo(orjson.dumps(summary.as_dict()).decode())
