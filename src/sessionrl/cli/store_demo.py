"""`sessionrl store demo`: fill a fresh store with realistic sessions, answer structured questions about them.

The questions are kept here as SQL over the query tables so the benchmark asks exactly the same ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from sessionrl.store import SessionQuery, SessionStore
from sessionrl.store.dialect import contains_pattern, match_phrase
from sessionrl.store.synthetic import ingest

CHRONIC_SQL = """
SELECT COUNT(*) AS matched,
       COALESCE(SUM(EXISTS (
           SELECT 1 FROM tool_calls c WHERE c.tool = :tool AND c.session_id = s.session_id
       )), 0) AS called
FROM sessions s
WHERE s.session_id IN (
    SELECT f.session_id FROM feedback_text t JOIN feedback f ON f.id = t.rowid
    WHERE feedback_text MATCH :phrase AND f.comment LIKE :pattern ESCAPE '\\'
)
"""
"""Of the sessions with a feedback comment containing a needle, how many called `:tool`.

`:phrase` is the needle as an FTS5 phrase (`dialect.match_phrase`, 3+ characters) looked up in the
trigram index `feedback_text`; `:pattern` (`dialect.contains_pattern`) re-checks the rows it finds with
`LIKE`, so the answer is exactly that of the typed `comment_contains` filter. The index leaves few
sessions (about 2% of the generated traffic), so one probe of the `(tool, session_id)` index per match
is cheaper than collecting every session that ever called the tool.
"""

FAILURE_RATES_SQL = """
SELECT tool, COUNT(*) AS calls,
       SUM(status <> 'success') AS failed,
       ROUND(AVG(status <> 'success'), 4) AS failure_rate,
       SUM(status = 'timeout') AS timeouts,
       SUM(status = 'error') AS errors
FROM tool_calls GROUP BY tool ORDER BY failure_rate DESC, tool
"""
"""Per-tool failure rate, split into timeouts and errors (both read from the `(tool, status)` index)."""

RATINGS_SQL = """
SELECT s.scenario,
       SUM(f.score = 1) AS r1, SUM(f.score = 2) AS r2, SUM(f.score = 3) AS r3,
       SUM(f.score = 4) AS r4, SUM(f.score = 5) AS r5,
       COUNT(*) AS ratings, ROUND(AVG(f.score), 3) AS mean
FROM feedback f JOIN sessions s ON s.session_id = f.session_id
WHERE f.type = 'human_rating' GROUP BY s.scenario ORDER BY s.scenario
"""
"""Distribution of human ratings (1–5) per scenario."""

P95_SQL = """
WITH ranked AS (
    SELECT tool, latency_ms,
           ROW_NUMBER() OVER (PARTITION BY tool ORDER BY latency_ms) AS position,
           COUNT(*) OVER (PARTITION BY tool) AS calls
    FROM tool_calls
)
SELECT tool, calls, ROUND(latency_ms, 1) AS p95_ms FROM ranked
WHERE position = (95 * calls + 99) / 100
ORDER BY p95_ms DESC LIMIT :top
"""
"""Nearest-rank p95 latency per tool (rank ceil(0.95·n)), timeouts included, slowest first."""

CHRONIC_NEEDLES = ("chronic disease", "慢性病")
CHRONIC_TOOL = "crp_test_request"


@dataclass(frozen=True)
class DemoConfig:
    """What the demo generates and where."""

    sessions: int = 3000
    """How many sessions to generate."""
    seed: int = 0
    """Seed of the generated traffic."""
    out: Path = Path("runs/store-demo")
    """Folder of the fresh store (`sessions.db`), replaced on every run."""

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise ValueError(f"sessions must be at least 1, got {self.sessions}")


@dataclass(frozen=True)
class ChronicAnswer:
    """The chronic-disease question for one wording, answered with typed filters and with SQL."""

    needle: str
    typed_matched: int
    typed_fraction: float
    sql_matched: int
    sql_fraction: float

    @property
    def agree(self) -> bool:
        """Whether both ways found the same sessions and the same fraction."""
        return self.typed_matched == self.sql_matched and abs(self.typed_fraction - self.sql_fraction) < 1e-12


def chronic_answer(store: SessionStore, needle: str, tool: str = CHRONIC_TOOL) -> ChronicAnswer:
    """Of the sessions whose feedback comment mentions `needle`, the share that called `tool`, both ways."""
    of = SessionQuery(comment_contains=needle)
    params = {"tool": tool, "phrase": match_phrase(needle), "pattern": contains_pattern(needle)}
    (row,) = store.sql(CHRONIC_SQL, params)
    matched, called = int(row["matched"]), int(row["called"])
    return ChronicAnswer(
        needle=needle,
        typed_matched=store.count(of),
        typed_fraction=store.fraction(of, SessionQuery(tool_called=tool)),
        sql_matched=matched,
        sql_fraction=called / matched if matched else 0.0,
    )


def fresh_store(folder: Path) -> SessionStore:
    """A new, empty file store at `folder/sessions.db` (an earlier one and its WAL files are removed)."""
    folder.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        (folder / f"sessions.db{suffix}").unlink(missing_ok=True)
    return SessionStore.open(f"sqlite:///{folder / 'sessions.db'}")


def run_demo(config: DemoConfig, console: Console) -> list[ChronicAnswer]:
    """Generate, store and question the sessions, printing every answer; returns the chronic answers."""
    with fresh_store(config.out) as store:
        started = time.perf_counter()
        events = ingest(store, config.sessions, seed=config.seed, progress=True, console=console)
        store.project()
        took = time.perf_counter() - started
        console.print(
            f"stored {config.sessions} sessions ({events} events) in {took:.1f} s "
            f"→ {config.out / 'sessions.db'}"
        )
        answers = [chronic_answer(store, needle) for needle in CHRONIC_NEEDLES]
        console.print(_chronic_table(answers))
        console.print(_table("Tool failure rates", store.sql(FAILURE_RATES_SQL)))
        console.print(_table("Human ratings by scenario", store.sql(RATINGS_SQL)))
        console.print(_table("Slowest tools (p95 latency)", store.sql(P95_SQL, {"top": 5})))
    return answers


def _chronic_table(answers: list[ChronicAnswer]) -> Table:
    table = Table(title=f"Of the sessions whose feedback mentions …, what fraction called {CHRONIC_TOOL}?")
    for column in ("mentions", "sessions (typed)", "fraction (typed)", "sessions (SQL)", "fraction (SQL)"):
        table.add_column(column)
    table.add_column("agree")
    for a in answers:
        cells = (a.needle, str(a.typed_matched), f"{a.typed_fraction:.3f}", str(a.sql_matched))
        table.add_row(*cells, f"{a.sql_fraction:.3f}", "yes" if a.agree else "[red]NO[/red]")
    return table


def _table(title: str, rows: list[dict[str, Any]]) -> Table:
    table = Table(title=title)
    for name in rows[0] if rows else ("(no rows)",):
        table.add_column(name, justify="left" if name in ("tool", "scenario") else "right")
    for row in rows:
        table.add_row(
            *("-" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for v in row.values())
        )
    return table


def command(
    sessions: Annotated[
        int, typer.Option(min=1, help="How many sessions to generate.")
    ] = DemoConfig.sessions,
    seed: Annotated[int, typer.Option(help="Seed of the generated traffic.")] = DemoConfig.seed,
    out: Annotated[Path, typer.Option(help="Folder of the fresh store.")] = DemoConfig.out,
) -> None:
    """Generate realistic sessions into a fresh store and answer structured questions about them."""
    answers = run_demo(DemoConfig(sessions=sessions, seed=seed, out=out), Console())
    if not all(a.agree for a in answers):
        raise typer.Exit(1)
