"""`sessionrl rewards ...`: score stored sessions, explain a reward term by term, re-score late feedback, and
say which unrated sessions are worth rating next."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sessionrl.cli.sessions import DEFAULT_DB, Db, err, open_store, reporting
from sessionrl.episodes.progress import progress
from sessionrl.errors import SessionRLError, require_extra
from sessionrl.rewards.engine import RewardConfig, RewardEngine, StoredReward
from sessionrl.rewards.judge.runner import Backend, JudgeConfig
from sessionrl.rewards.vector import LayerValue, RewardVector
from sessionrl.session.lifecycle import TERMINAL
from sessionrl.store import SessionStore
from sessionrl.store.records import RewardRecord

app = typer.Typer(help="Reward shaping: score, explain, re-score.", no_args_is_help=True)

DEFAULT_STATS = Path("runs/reward_stats.json")
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


def _summary(console: Console, stored: list[StoredReward], ruleset_version: str) -> None:
    new = sum(s.new for s in stored)
    console.print(
        f"{len(stored)} sessions: [bold]{new}[/bold] new reward versions, {len(stored) - new} unchanged "
        f"(rules {ruleset_version})"
    )


@app.command("score")
def score(
    db: Db = DEFAULT_DB,
    rules: Rules = None,
    stats: Stats = None,
    contracts: Contracts = None,
    judge: JudgeBackend = Backend.OFFLINE,
    judge_model: JudgeModel = None,
    judge_url: JudgeUrl = None,
) -> None:
    """Score every session that has ended (finished, rejected or archived); a session gets a new reward
    version only if it, or the rules, changed since its last one. Sessions still running are skipped and
    counted: they are scored once they end."""
    console = Console()
    engine = _engine(rules, stats, contracts, judge, judge_model, judge_url)
    stored: list[StoredReward] = []
    with reporting(), open_store(db, create=False) as store:
        ids = sorted(sid for state in sorted(TERMINAL) for sid in store.session_ids(state))
        running = len(store.session_ids()) - len(ids)
        with progress(console, "score", len(ids)) as bar:
            for session_id in ids:
                stored.append(engine.score_and_store(store, session_id))
                bar.advance()
    engine.save_stats()
    _summary(console, stored, engine.ruleset.version)
    if running:
        console.print(
            f"{running} unfinished session(s) skipped: a session is scored once it has ended "
            "(finished, rejected or archived)"
        )


@app.command("rescore")
def rescore(
    since: Annotated[
        str, typer.Option("--since", help="ISO time; feedback received from then on is re-scored.")
    ],
    db: Db = DEFAULT_DB,
    rules: Rules = None,
    stats: Stats = None,
    contracts: Contracts = None,
    judge: JudgeBackend = Backend.OFFLINE,
    judge_model: JudgeModel = None,
    judge_url: JudgeUrl = None,
) -> None:
    """Re-score the ended sessions that received feedback since a time (late feedback → new reward
    versions); like `score`, it leaves sessions still running for when they end."""
    try:
        moment = datetime.fromisoformat(since)
    except ValueError as exc:
        raise typer.BadParameter(f"--since: {exc}; use e.g. 2025-03-01T12:00:00Z") from exc
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    engine = _engine(rules, stats, contracts, judge, judge_model, judge_url)
    with reporting(), open_store(db, create=False) as store:
        stored = engine.rescore(store, moment)
    _summary(Console(), stored, engine.ruleset.version)


@app.command("explain")
def explain(
    session_id: Annotated[str, typer.Argument(help="Session to explain.")],
    db: Db = DEFAULT_DB,
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
    """Show a session's reward term by term (value, layer, credited steps and why), and each layer's raw
    total beside its normalised value and the normaliser that made it."""
    with reporting(), open_store(db, create=False) as store:
        if fresh:
            engine = _engine(rules, stats, contracts, Backend.OFFLINE, None, None, learn=False)
            vector = engine.score(store.get(session_id))
        else:
            vector = RewardVector.model_validate(_stored_reward(store, session_id, version).vector)
    _print_vector(Console(), vector)


@app.command("queue")
def queue(
    db: Db = DEFAULT_DB,
    k: Annotated[int, typer.Option("--k", min=1, help="How many unrated sessions to list.")] = 10,
    min_rated: Annotated[
        int, typer.Option("--min-rated", min=4, help="Fewest rated sessions worth fitting on.")
    ] = 20,
) -> None:
    """Fit the reward model on the ended sessions people rated, report its held-out error, and list the
    unrated ones whose rating it is least sure of (widest 10-90% interval): the most useful to rate next."""
    with reporting():
        require_extra("the reward model", "train", "sklearn")
    from sessionrl.rewards.sparse import RewardModel, RewardModelConfig, uncertainty_queue  # scikit-learn

    with reporting(), open_store(db, create=False) as store:
        ended = [s for s in store.iter_sessions() if s.state in TERMINAL]
        model = RewardModel(RewardModelConfig(min_rated=min_rated))
        report = model.fit(ended)
        items = uncertainty_queue(model, ended, k)
    auc = "n/a (one class held out)" if report.auc is None else f"{report.auc:.3f}"
    console = Console()
    console.print(
        f"reward model fitted on {report.n_train} rated sessions, tested on {report.n_test} held out: "
        f"MAE {report.mae:.3f} (predicting the mean: {report.baseline_mae:.3f}), AUC of rating > 3: {auc}"
    )
    table = Table("session", "predicted", "10%", "90%", title=f"rate next ({len(items)} of the unrated)")
    for item in items:
        table.add_row(escape(item.session_id), f"{item.predicted:.2f}", f"{item.low:.2f}", f"{item.high:.2f}")
    console.print(table)


def _stored_reward(store: SessionStore, session_id: str, version: int | None) -> RewardRecord:
    """The reward version asked for; for a session never scored, a one-line error saying how to score it."""
    if version is None and not store.rewards(session_id):  # NotFound for an unknown session
        state = store.get(session_id).state
        how = (
            "run `sessionrl rewards score` first"
            if state in TERMINAL
            else f"it is {state.value}; sessions are scored once they end (then `sessionrl rewards score`)"
        )
        err.print(f"[red]error:[/red] session {escape(session_id)} has no reward yet: {how}", soft_wrap=True)
        raise typer.Exit(1)
    return store.reward(session_id, version)


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
    console.print(_layers_table(vector))
    console.print(_normaliser_line(vector), soft_wrap=True)
    console.print(
        f"session reward [bold]{vector.session_reward:+.4f}[/bold], long-term reward "
        f"[bold]{vector.long_term_reward:+.4f}[/bold], rating {vector.rating}"
        f"{' by ' + ', '.join(vector.rated_by) if vector.rated_by else ''}, "
        f"scored {vector.scored_at:%Y-%m-%d %H:%M:%S}"
    )


def _layers_table(vector: RewardVector) -> Table:
    """Raw total and normalised value side by side, with the mean and scale between them (`-` where the
    normaliser had not started); a value the clip bounded is marked."""
    layers = Table(title="layers: normalised = (raw − mean) / scale, clipped")
    for column in ("layer", "raw", "mean", "scale", "normalised", "weight", "contribution"):
        layers.add_column(column, justify="left" if column == "layer" else "right")
    for name, layer in vector.layers.items():
        started = layer.mean is not None and (layer.seen or 0) >= 1
        layers.add_row(
            name,
            f"{layer.raw:+.3f}",
            f"{layer.mean:+.3f}" if started and layer.mean is not None else "-",
            f"{layer.scale:.3f}" if started else "-",
            f"{layer.normalised:+.3f}{' (clipped)' if is_clipped(layer) else ''}",
            f"{layer.weight:g}",
            f"{layer.contribution:+.3f}",
        )
    return layers


def is_clipped(layer: LayerValue) -> bool:
    """Whether the clip bounded a layer's normalised value (it differs from (raw − mean) / scale)."""
    if layer.mean is None:
        return False
    return abs((layer.raw - layer.mean) / layer.scale - layer.normalised) > 1e-9


def _normaliser_line(vector: RewardVector) -> str:
    """Which normaliser applied: the running statistics of the vector's rules, and after how many sessions."""
    seen = sorted({layer.seen for layer in vector.layers.values() if layer.seen is not None})
    rules = vector.ruleset_version
    if not seen:
        return "normaliser: not recorded (this reward was stored before sessionrl kept it)"
    if seen[-1] < 1:
        return (
            f"normaliser: not started: the statistics of rules {rules} held no scored session, "
            "so each layer's raw total was used as is"
        )
    counts = ", ".join(map(str, seen))
    return (
        f"normaliser: the running mean (shrunk towards 0) and scale (at least 1) of each layer under rules "
        f"{rules}, after {counts} scored session(s)"
    )
