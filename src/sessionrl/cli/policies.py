"""`sessionrl policies ...`: the policy registry, A/B comparison, canary checks and the strategy switch.

Every command works on the store given by `--db` (the service's store), so a change made here reaches a
running service on its next step: routing and the strategy mode are read from the store.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table

from sessionrl.cli.sessions import DEFAULT_DB, Db, Json, emit_json, open_store, out, print_rows, reporting
from sessionrl.ops.analysis import Comparison, compare_versions
from sessionrl.ops.canary import check_canary
from sessionrl.ops.config import OpsConfig
from sessionrl.ops.registry import Lineage, PolicyRegistry, PolicyVersion, Stage
from sessionrl.ops.serving import load_hf_policy
from sessionrl.ops.strategy import StrategyMode, current_mode, set_mode

app = typer.Typer(
    help="Policy versions: register, promote, roll back, compare, canary checks.", no_args_is_help=True
)

Policy = Annotated[str, typer.Argument(help="The policy's name in the registry (such as orders).")]
Version = Annotated[int, typer.Argument(help="A version number of the policy.")]
Reason = Annotated[str, typer.Option(help="Why: kept in the operations log.")]


def _row(v: PolicyVersion) -> dict[str, Any]:
    return {
        "policy": v.policy,
        "version": v.version,
        "stage": v.stage.value,
        "share": v.share,
        "kind": v.kind,
        "artifact": v.artifact,
        "run_dir": v.lineage.run_dir,
        "updated_at": v.updated_at,
    }


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None or value.tzinfo else value.replace(tzinfo=UTC)


def artifact_loads(version: PolicyVersion) -> None:
    """The check `register` and `promote` run: an `llm` artifact loads as serving loads it; an artifact of
    a kind serving does not load must at least exist."""
    if version.kind == "llm":
        load_hf_policy(version)
    elif not Path(version.artifact).exists():
        raise FileNotFoundError("no such file or folder")


@app.command("list")
def list_versions(
    policy: Annotated[str | None, typer.Argument()] = None, db: Db = DEFAULT_DB, as_json: Json = False
) -> None:
    """Every registered version (of one policy) with its stage."""
    with reporting(), open_store(db, create=False) as store:
        rows = [_row(v) for v in PolicyRegistry(store).versions(policy)]
    emit_json(rows) if as_json else print_rows(rows, title=f"{len(rows)} version(s)")


@app.command("show")
def show(policy: Policy, version: Version, db: Db = DEFAULT_DB) -> None:
    """One version with its lineage and evaluation, as JSON."""
    with reporting(), open_store(db, create=False) as store:
        found = PolicyRegistry(store).get(policy, version)
    typer.echo(found.model_dump_json(indent=2))


@app.command("register")
def register(
    policy: Policy,
    artifact: Annotated[str, typer.Argument(help="The exported policy's folder.")],
    db: Db = DEFAULT_DB,
    kind: Annotated[str, typer.Option(help="llm or structured.")] = "llm",
    run_dir: Annotated[Path | None, typer.Option(help="The run that made it.")] = None,
    note: Annotated[str | None, typer.Option(help="Why this version exists.")] = None,
) -> None:
    """Register the next version of a policy as a candidate, once its artifact has loaded."""
    lineage = Lineage(run_dir=str(run_dir) if run_dir else None, note=note)
    with reporting(), open_store(db) as store:
        made = PolicyRegistry(store, check=artifact_loads).register(
            policy, artifact, kind=kind, lineage=lineage
        )
    out.print(f"registered {policy} v{made.version} ({made.stage})")


@app.command("promote")
def promote(
    policy: Policy,
    version: Version,
    db: Db = DEFAULT_DB,
    canary: Annotated[
        float | None, typer.Option(help="Start a canary serving this share of sessions (0-1) instead.")
    ] = None,
    reason: Reason = "",
) -> None:
    """Put a version in production (or, with --canary SHARE, start it as a canary), once its artifact has
    loaded: one that was deleted or damaged since it was registered is refused."""
    to = Stage.PRODUCTION if canary is None else Stage.CANARY
    with reporting(), open_store(db, create=False) as store:
        registry = PolicyRegistry(store, check=artifact_loads)
        moved = registry.promote(policy, version, to, share=canary, reason=reason)
    share = f" on {moved.share:.0%} of sessions" if moved.stage is Stage.CANARY else ""
    out.print(f"{policy} v{moved.version} is {moved.stage}{share}")


@app.command("rollback")
def rollback(
    policy: Policy, reason: Annotated[str, typer.Option(help="Why (required).")], db: Db = DEFAULT_DB
) -> None:
    """Stop the canary; without one, bring back the previous production version."""
    with reporting(), open_store(db, create=False) as store:
        serving = PolicyRegistry(store).rollback(policy, reason=reason)
    out.print(f"rolled back: {policy} v{serving.version} serves production")


@app.command("compare")
def compare(
    policy: Policy,
    a: Annotated[int, typer.Argument(help="The baseline version.")],
    b: Annotated[int, typer.Argument(help="The version compared with it.")],
    db: Db = DEFAULT_DB,
    since: Annotated[datetime | None, typer.Option(help="Sessions created at or after (UTC).")] = None,
    until: Annotated[datetime | None, typer.Option(help="Sessions created before (UTC).")] = None,
    scenario: Annotated[str | None, typer.Option(help="Only sessions of this scenario.")] = None,
    as_json: Json = False,
) -> None:
    """Compare two versions on the sessions each served: each metric with B - A, its 95% CI and p-value."""
    with reporting(), open_store(db, create=False) as store:
        result = compare_versions(
            store, policy, a, b, since=_utc(since), until=_utc(until), scenario=scenario
        )
    if as_json:
        typer.echo(result.model_dump_json())
        return
    out.print(comparison_table(result))


def comparison_table(result: Comparison) -> Table:
    """A comparison as a table: one row per metric."""
    table = Table(
        "metric",
        f"v{result.a}",
        f"v{result.b}",
        "n",
        "B - A",
        "95% CI",
        "p",
        "test",
        title=f"{result.policy}: v{result.a} ({result.n_a} sessions) vs v{result.b} ({result.n_b} sessions)",
    )
    for name, m in result.metrics.items():
        ci = "-" if m.ci is None else f"[{m.ci[0]:+.3f}, {m.ci[1]:+.3f}]"
        table.add_row(
            name,
            _num(m.a),
            _num(m.b),
            f"{m.n_a}/{m.n_b}",
            "-" if m.diff is None else f"{m.diff:+.3f}",
            ci,
            _num(m.p_value),
            m.test,
        )
    return table


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


@app.command("check")
def check(
    config: Annotated[Path, typer.Argument(help="Operations config (YAML): policy, canary rules, webhook.")],
    db: Db = DEFAULT_DB,
) -> None:
    """Run one canary check now: roll back, promote, or wait, by the config's rules."""
    with reporting():
        ops = OpsConfig.model_validate(yaml.safe_load(config.read_text()) or {})
        with open_store(db, create=False) as store:
            verdict = check_canary(PolicyRegistry(store), ops)
    if verdict is None:
        out.print(f"{ops.policy}: no canary to check")
        return
    out.print(comparison_table(verdict.comparison))
    out.print(
        f"{verdict.action}: {verdict.reason} (judged sessions {verdict.judged[0]} / {verdict.judged[1]})"
    )


@app.command("log")
def log(
    db: Db = DEFAULT_DB,
    kind: Annotated[
        str | None, typer.Option(help="Only lines of this kind (stage, alert, canary_check, loop, ...).")
    ] = None,
    policy: Annotated[str | None, typer.Option(help="Only lines about this policy.")] = None,
    as_json: Json = False,
) -> None:
    """The operations log: stage changes, canary checks, loop decisions, switches, alerts."""
    with reporting(), open_store(db, create=False) as store:
        rows = [e.model_dump() for e in PolicyRegistry(store).log(kind=kind, policy=policy)]
    emit_json(rows) if as_json else print_rows(rows, title=f"{len(rows)} line(s)")


@app.command("strategy")
def strategy(
    mode: Annotated[
        StrategyMode | None, typer.Argument(help="policy, rules or human; none: print it.")
    ] = None,
    db: Db = DEFAULT_DB,
    reason: Reason = "",
) -> None:
    """Print or switch the strategy mode every session follows from its next step on."""
    with reporting(), open_store(db) as store:
        registry = PolicyRegistry(store)
        chosen = current_mode(registry) if mode is None else set_mode(registry, mode, reason=reason)
    out.print(f"strategy_mode: {chosen}")
