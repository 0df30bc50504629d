"""`sessionrl envs ...`: list and inspect the registered task environments, run scripted plans into the store.

An environment is named as `sessionrl.envs.build` takes it: a registered name (`envs list` shows them,
entry points of installed packages included) or `module:Class`. Its options come from `--data DIR` (the
data folder of a τ-bench-style domain) and `-o KEY=VALUE` (any option, such as `-o train=100`).

`check` runs `check_env` and prints its fix-it text. `run-expert` and `replay-gold` run the split asked for
(by default train and test, or the one split a domain has) and refuse an empty split by naming the splits
the domain has. They end with one JSON line (`env`, `split`, `agent`, `n`, `successes`,
`success_rate`, `failed`, and `reasons`: how many failed episodes each reason accounts for, see
`sessionrl.episodes.why_unsolved`), so scripts can read the result from the last line of the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
import yaml
from rich.markup import escape
from rich.table import Table

from sessionrl.cli.sessions import DEFAULT_DB, Db, err, open_store, out, reporting
from sessionrl.envs import DecisionEnv, EnvBuildError, EnvCheckError, Split, Task, build, check_env, env_names
from sessionrl.envs.base import GoldPlans
from sessionrl.envs.registry import REGISTRY
from sessionrl.envs.splits import NoTasks, describe_splits, task_counts, tasks_of
from sessionrl.envs.taubench import DataMissing
from sessionrl.episodes import RolloutConfig, RunSummary, ScriptedAgent, expert, gold, run_many
from sessionrl.skills import SkillContract

POLICY_LINES = 12
"""Lines of the domain policy `show` prints."""

EnvName = Annotated[
    str,
    typer.Argument(help="A registered environment (see `envs list`) or module:Class.", show_default=False),
]
DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data",
        help="The data folder of a τ-bench-style domain (its `data` option) [default: the domain's "
        "environment variable, $SESSIONRL_RETAIL_DATA for retail]",
        show_default=False,
        file_okay=False,
    ),
]
OptionOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--option",
        "-o",
        help="An option of the environment as KEY=VALUE (repeatable), such as -o train=100.",
        show_default=False,
    ),
]
SplitOpt = Annotated[
    Split | None,
    typer.Option(
        "--split",
        help="Which tasks: train, dev or test [default: train for run-expert, test for replay-gold, or the "
        "one split the domain has]",
        show_default=False,
    ),
]
ListDataOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--data",
        help="NAME=DIR: the data folder of the τ-bench-style domain NAME (repeatable). A bare DIR goes to "
        "the domains whose files it holds.",
        show_default=False,
    ),
]
CountOpt = Annotated[int | None, typer.Option("--n", min=1, help="Run the first N tasks [default: all].")]
ConcurrencyOpt = Annotated[int, typer.Option(min=1, help="Episodes in flight at once.")]
SeedOpt = Annotated[int, typer.Option(help="Seeds every episode (each task draws its own seed from it).")]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar on stderr.")]

app = typer.Typer(help="List, inspect and run the registered task environments.", no_args_is_help=True)


def env_options(data: Path | None, options: Sequence[str] | None = None) -> dict[str, Any]:
    """`--data` and each `-o KEY=VALUE` as keyword options; a value reads as a YAML scalar (`100` is a
    number, `true` a boolean), and the environment's factory checks each one."""
    parsed: dict[str, Any] = {} if data is None else {"data": data}
    for option in options or ():
        key, sep, value = option.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{option!r} is not KEY=VALUE", param_hint="--option")
        parsed[key.strip()] = yaml.safe_load(value)
    return parsed


def load_env(name: str, data: Path | None = None, options: Sequence[str] | None = None) -> DecisionEnv:
    """Build the environment `name` (see `sessionrl.envs.build`) with `--data` and `-o` options."""
    return build(name, **env_options(data, options))


def _load_or_exit(name: str, data: Path | None, options: Sequence[str] | None = None) -> DecisionEnv:
    """`load_env`, or a one-line error saying what to change (how to get the data, which options exist),
    and exit status 1."""
    try:
        return load_env(name, data, options)
    except EnvBuildError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from exc


def _list_data(entries: Sequence[str]) -> tuple[dict[str, Path], Path | None]:
    """`--data` of `list`: folders by domain name (`NAME=DIR`), and the one bare `DIR` if given."""
    named: dict[str, Path] = {}
    bare: list[Path] = []
    for entry in entries:
        name, sep, folder = entry.partition("=")
        if sep and name.strip() and folder.strip():
            named[name.strip()] = Path(folder.strip())
        else:
            bare.append(Path(entry))
    if len(bare) > 1:
        raise typer.BadParameter("give one bare DIR at most; name the others NAME=DIR", param_hint="--data")
    unknown = sorted(set(named) - set(env_names()))
    if unknown:
        known = ", ".join(env_names())
        raise typer.BadParameter(f"no env named {', '.join(unknown)}; known: {known}", param_hint="--data")
    return named, bare[0] if bare else None


def _listed(name: str, named: dict[str, Path], bare: Path | None, fits: set[str]) -> DecisionEnv | str:
    """The environment `name` as `list` shows it, or a note saying why it cannot be built.

    A domain that takes a data folder gets its own `NAME=DIR`, else the bare DIR when that holds its files
    (then its name is added to `fits`), else its default (its environment variable).
    """
    try:
        if "data" not in REGISTRY.options(name):
            return f"takes no data folder; --data {name}=... is not used" if name in named else load_env(name)
        if name in named:
            return load_env(name, named[name])
        if bare is not None:
            try:
                env = load_env(name, bare)
            except DataMissing:
                pass  # the bare folder belongs to another domain
            else:
                fits.add(name)
                return env
        return load_env(name)
    except DataMissing as exc:
        if name in named:
            return exc.problem
        return f"no data: pass --data {name}=DIR" + (f" or set {exc.variable}" if exc.variable else "")
    except EnvBuildError as exc:
        return str(exc).split(". ")[0]


@app.command("list")
def list_envs(data: ListDataOpt = None) -> None:
    """Every registered environment (built-in or from an installed package) with its skills and task
    counts per split."""
    named, bare = _list_data(data or ())
    table = Table(title="environments")
    for column in ("env", "skills", *Split):
        table.add_column(column, justify="right" if column in ("skills", *Split) else "left")
    table.add_column("note", overflow="fold")  # a path is folded, never cut
    fits: set[str] = set()
    for name in env_names():
        env = _listed(name, named, bare, fits)
        if isinstance(env, str):
            table.add_row(name, "-", *("-" for _ in Split), escape(env))
            continue
        counts = (str(len(env.tasks(split))) for split in Split)
        table.add_row(name, str(len(env.contracts())), *counts, "")
    out.print(table)
    if bare is not None and not fits:
        note = f"--data {escape(str(bare))} holds the files of none of them; name one: --data NAME=DIR"
        err.print(note, soft_wrap=True)


@app.command("check")
def check(
    env_name: EnvName,
    data: DataDir = None,
    option: OptionOpt = None,
    tasks: Annotated[int, typer.Option("--tasks", min=1, help="Tasks checked in each split.")] = 3,
) -> None:
    """Check that an environment keeps the DecisionEnv promises (`check_env`): its contracts, tasks and
    skills, and that the expert solves the first tasks of each split. A failure says how to fix it."""
    env = _load_or_exit(env_name, data, option)
    try:
        warnings = check_env(env, tasks_per_split=tasks)
    except EnvCheckError as exc:
        err.print(f"[red]check failed:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from exc
    for warning in warnings:
        out.print(f"[yellow]warning:[/yellow] {escape(warning)}", soft_wrap=True)
    checked = sum(min(n, tasks) for n in task_counts(env).values())
    out.print(
        f"{env.name} passes check_env: {len(env.contracts())} skills, {checked} tasks checked "
        f"(of {describe_splits(env)}), {len(warnings)} warning(s)",
        soft_wrap=True,
    )


@app.command("show")
def show(env_name: EnvName, data: DataDir = None, option: OptionOpt = None) -> None:
    """An environment's skill contracts, the start of its policy, and a sample task with the expert's plan."""
    env = _load_or_exit(env_name, data, option)
    counts = ", ".join(f"{len(env.tasks(split))} {split}" for split in Split)
    out.print(f"[bold]{env.name}[/bold]: {len(env.contracts())} skills; tasks: {counts}")
    out.print(_contracts_table(env.contracts()))
    lines = env.system_prompt().strip().splitlines()
    out.rule("policy")
    out.print(escape("\n".join(lines[:POLICY_LINES])))
    if len(lines) > POLICY_LINES:
        out.print(f"[dim]… {len(lines) - POLICY_LINES} more lines[/dim]")
    sample = next((tasks[0] for tasks in map(env.tasks, Split) if tasks), None)
    if sample is not None:
        _show_task(env, sample)


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
    split: SplitOpt = None,
    n: CountOpt = None,
    db: Db = DEFAULT_DB,
    data: DataDir = None,
    option: OptionOpt = None,
    concurrency: ConcurrencyOpt = 16,
    seed: SeedOpt = 0,
    progress: ProgressOpt = True,
) -> None:
    """Run the expert through the orchestrator on a split's tasks into the store; print the success rate."""
    env = _load_or_exit(env_name, data, option)
    chosen = _split_or_exit(env, split, Split.TRAIN)
    _run(env, expert(env), chosen, n, db=db, concurrency=concurrency, seed=seed, progress=progress)


@app.command("replay-gold")
def replay_gold(
    env_name: EnvName,
    split: SplitOpt = None,
    n: CountOpt = None,
    db: Db = DEFAULT_DB,
    data: DataDir = None,
    option: OptionOpt = None,
    concurrency: ConcurrencyOpt = 16,
    seed: SeedOpt = 0,
    progress: ProgressOpt = True,
) -> None:
    """Replay the tasks' gold actions (τ-bench-style domains) through the orchestrator into the store."""
    env = _load_or_exit(env_name, data, option)
    if not isinstance(env, GoldPlans):
        err.print(f"[red]error:[/red] {env.name} has no gold actions; only τ-bench-style domains have them")
        raise typer.Exit(1)
    chosen = _split_or_exit(env, split, Split.TEST)
    _run(env, gold(env), chosen, n, db=db, concurrency=concurrency, seed=seed, progress=progress)


def choose_split(env: DecisionEnv, asked: Split | None, default: Split) -> Split:
    """The split to run: `asked` when given, else `default` when it has tasks, else the one split `env`
    has tasks in. Raises `NoTasks` when the split is empty, naming the splits `env` has."""
    have = list(task_counts(env))
    if asked is None:
        asked = have[0] if len(have) == 1 and default not in have else default
    how = f"pass --split {' or '.join(have)}" if have else "it has no tasks to run"
    tasks_of(env, asked, how)
    return asked


def _split_or_exit(env: DecisionEnv, asked: Split | None, default: Split) -> Split:
    try:
        return choose_split(env, asked, default)
    except NoTasks as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from exc


def _run(
    env: DecisionEnv,
    agent: ScriptedAgent,
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
        config = RolloutConfig(concurrency=concurrency)
        summary = run_many(
            env, split, agent, n, store=store, config=config, seed=seed, show_progress=progress
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
        why = ", ".join(f"{count} {reason}" for reason, count in sorted(summary.reasons.items()))
        out.print(f"why: {escape(why)}", soft_wrap=True)
    typer.echo(orjson.dumps(summary.as_dict()).decode())
