"""`sessionrl rewards ...`: score stored sessions, explain a reward term by term, re-score late feedback."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from sessionrl.errors import SessionRLError
from sessionrl.rewards.engine import RewardConfig, RewardEngine, StoredReward
from sessionrl.rewards.judge.runner import Backend, JudgeConfig
from sessionrl.rewards.vector import RewardVector
from sessionrl.session.lifecycle import TERMINAL
from sessionrl.store import SessionStore

app = typer.Typer(help="Reward shaping: score, explain, re-score.", no_args_is_help=True)

DEFAULT_DB = "sqlite:///runs/sessions.db"
DEFAULT_STATS = Path("runs/reward_stats.json")

Db = Annotated[
    str | None,
    typer.Option("--db", help=f"Store URL [default: $SESSIONRL_DB or {DEFAULT_DB}]", show_default=False),
]
Rules = Annotated[Path | None, typer.Option("--rules", help="Rule file (YAML); the shipped rules if unset.")]
Stats = Annotated[
    Path | None,
    typer.Option(
        "--stats", help="Layer statistics file [default: <rules>.stats.json or runs/reward_stats.json]"
    ),
]
Contracts = Annotated[
    Path | None, typer.Option("--contracts", help="Folder of skill contracts (SLA p95 = latency budget).")
]
JudgeBackend = Annotated[Backend, typer.Option("--judge", help="Comment judge backend.")]
JudgeModel = Annotated[Path | None, typer.Option("--judge-model", help="Local model folder (--judge hf).")]
JudgeUrl = Annotated[str | None, typer.Option("--judge-url", help="Endpoint root (--judge openai).")]


def _db(db: str | None) -> str:
    return db or os.environ.get("SESSIONRL_DB") or DEFAULT_DB


def _engine(
    rules: Path | None,
    stats: Path | None,
    contracts: Path | None,
    judge: Backend,
    model: Path | None,
    url: str | None,
    *,
    learn: bool = True,
) -> RewardEngine:
    """An engine from the command-line options; bad options and bad rule files exit with their message."""
    stats_path = stats or (rules.with_suffix(".stats.json") if rules is not None else DEFAULT_STATS)
    try:
        judge_config = JudgeConfig(backend=judge, model_path=model, base_url=url)
        config = RewardConfig(
            rules=rules, stats_path=stats_path, contracts=contracts, judge=judge_config, learn=learn
        )
        return RewardEngine(config)
    except (ValueError, SessionRLError) as exc:
        raise typer.BadParameter(str(exc)) from exc


def _progress(console: Console, label: str) -> Progress:
    return Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def _summary(console: Console, stored: list[StoredReward], ruleset_version: str) -> None:
    new = sum(s.new for s in stored)
    console.print(
        f"{len(stored)} sessions: [bold]{new}[/bold] new reward versions, {len(stored) - new} unchanged "
        f"(rules {ruleset_version})"
    )


@app.command("score")
def score(
    db: Db = None,
    rules: Rules = None,
    stats: Stats = None,
    contracts: Contracts = None,
    judge: JudgeBackend = Backend.OFFLINE,
    judge_model: JudgeModel = None,
    judge_url: JudgeUrl = None,
) -> None:
    """Score every session that has ended (finished, rejected or archived); a session gets a new reward
    version only if it, or the rules, changed since its last one."""
    console = Console()
    engine = _engine(rules, stats, contracts, judge, judge_model, judge_url)
    stored: list[StoredReward] = []
    with SessionStore.open(_db(db)) as store, _progress(console, "score") as bar:
        ids = sorted(sid for state in sorted(TERMINAL) for sid in store.session_ids(state))
        task = bar.add_task("sessions", total=len(ids))
        for session_id in ids:
            stored.append(engine.score_and_store(store, session_id))
            bar.advance(task)
    engine.save_stats()
    _summary(console, stored, engine.ruleset.version)


@app.command("rescore")
def rescore(
    since: Annotated[
        str, typer.Option("--since", help="ISO time; feedback received from then on is re-scored.")
    ],
    db: Db = None,
    rules: Rules = None,
    stats: Stats = None,
    contracts: Contracts = None,
    judge: JudgeBackend = Backend.OFFLINE,
    judge_model: JudgeModel = None,
    judge_url: JudgeUrl = None,
) -> None:
    """Re-score the sessions that received feedback since a time (late feedback → new reward versions)."""
    try:
        moment = datetime.fromisoformat(since)
    except ValueError as exc:
        raise typer.BadParameter(f"--since: {exc}; use e.g. 2025-03-01T12:00:00Z") from exc
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    engine = _engine(rules, stats, contracts, judge, judge_model, judge_url)
    with SessionStore.open(_db(db)) as store:
        stored = engine.rescore(store, moment)
    _summary(Console(), stored, engine.ruleset.version)


@app.command("explain")
def explain(
    session_id: Annotated[str, typer.Argument(help="Session to explain.")],
    db: Db = None,
    version: Annotated[
        int | None, typer.Option("--version", help="Stored reward version [default: latest]")
    ] = None,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Score now with the current rules, store nothing.")
    ] = False,
    rules: Rules = None,
    stats: Stats = None,
    contracts: Contracts = None,
) -> None:
    """Show a session's reward term by term: value, layer, credited steps and why."""
    with SessionStore.open(_db(db)) as store:
        try:
            if fresh:
                engine = _engine(rules, stats, contracts, Backend.OFFLINE, None, None, learn=False)
                vector = engine.score(store.get(session_id))
            else:
                vector = RewardVector.model_validate(store.reward(session_id, version).vector)
        except SessionRLError as exc:
            raise typer.BadParameter(str(exc)) from exc
    _print_vector(Console(), vector)


def _print_vector(console: Console, vector: RewardVector) -> None:
    terms = Table(title=f"{vector.session_id} — rules {vector.ruleset_version}, {vector.scheme}")
    for column in ("term", "kind", "layer", "value", "steps", "why"):
        terms.add_column(column, justify="right" if column == "value" else "left")
    for t in vector.terms:
        steps = ", ".join(f"{k} {v:+.3f}" for k, v in list(t.steps.items())[:3])
        steps += f" (+{len(t.steps) - 3})" if len(t.steps) > 3 else ""
        style = "dim" if t.value == 0 else ""
        terms.add_row(t.name, t.kind, t.layer, f"{t.value:+.3f}", steps, t.explanation, style=style)
    console.print(terms)
    layers = Table(title="layers")
    for column in ("layer", "raw", "normalised", "weight", "contribution"):
        layers.add_column(column, justify="left" if column == "layer" else "right")
    for name, layer in vector.layers.items():
        layers.add_row(
            name,
            f"{layer.raw:+.3f}",
            f"{layer.normalised:+.3f}",
            f"{layer.weight:g}",
            f"{layer.contribution:+.3f}",
        )
    console.print(layers)
    console.print(
        f"session reward [bold]{vector.session_reward:+.4f}[/bold], long-term reward "
        f"[bold]{vector.long_term_reward:+.4f}[/bold], rating {vector.rating}, "
        f"scored {vector.scored_at:%Y-%m-%d %H:%M:%S}"
    )
