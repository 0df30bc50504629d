"""`sessionrl sessions ...`: list, show, query, import and export Decision Sessions."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from pydantic import ValidationError
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from sessionrl.capture.documents import document_events
from sessionrl.capture.export_otlp import otlp_lines
from sessionrl.capture.formats import ExportFormat, ImportFormat, read_file
from sessionrl.capture.importers import ImportProblem, warning_summary
from sessionrl.errors import InvalidEvent, InvalidTransition, NotFound, SessionRLError
from sessionrl.session import codec
from sessionrl.session.events import (
    EVENT_ADAPTER,
    Event,
    SessionCreated,
    apply,
)
from sessionrl.session.model import (
    CallStatus,
    FeedbackType,
    LLMCall,
    Session,
    SessionState,
)
from sessionrl.session.schema import load_session
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.store.dialect import parse_url
from sessionrl.store.query import ToolShare
from sessionrl.store.records import SessionRow

DEFAULT_DB = "sqlite:///runs/sessions.db"
DB_ENV = "SESSIONRL_DB"

Db = Annotated[
    str,
    typer.Option(
        "--db",
        envvar=DB_ENV,
        help="Session store: a file (runs/sessions.db) or a URL (sqlite:///runs/sessions.db, sqlite:// "
        "in memory).",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object per line instead of a table.")]

app = typer.Typer(help="Browse, query, import and export Decision Sessions.", no_args_is_help=True)
out = Console()
err = Console(stderr=True)


def store_url(db: str) -> str:
    """The store URL a `--db` value names: a URL as given, a file path as `sqlite:///<path>`.

    >>> store_url("runs/s.db"), store_url("/tmp/s.db"), store_url("sqlite://")
    ('sqlite:///runs/s.db', 'sqlite:////tmp/s.db', 'sqlite://')
    """
    return db if "://" in db else f"sqlite:///{db}"


def open_store(db: str, *, create: bool = True) -> SessionStore:
    """Open the store `db` names (a path or a URL, see `store_url`), creating it when it is new.

    Commands that only read pass `create=False`: a file store that does not exist is then a one-line
    error saying so (exit status 1) instead of a new, empty store that answers every question with nothing.
    """
    url = store_url(db)
    path = parse_url(url).path if url.startswith("sqlite:") else None
    if not create and path is not None and not Path(path).exists():
        err.print(
            f"[red]error:[/red] no session store at {escape(path)}: nothing was written there yet. "
            f"Write sessions first (sessionrl envs run-expert orders --n 10, or sessionrl serve), or point "
            f"--db or ${DB_ENV} at an existing store.",
            soft_wrap=True,
        )
        raise typer.Exit(1)
    return SessionStore.open(url)


@contextmanager
def reporting() -> Iterator[None]:
    """Turn sessionrl and validation errors into a one-line message (never wrapped) and exit status 1."""
    try:
        yield
    except SessionRLError as exc:
        err.print(f"[red]error:[/red] {escape(' '.join(str(exc).split()))}", soft_wrap=True)
        raise typer.Exit(1) from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "options"
        err.print(f"[red]error:[/red] {escape(where)}: {escape(first['msg'])}", soft_wrap=True)
        raise typer.Exit(1) from exc


def emit_json(rows: list[dict[str, Any]]) -> None:
    """Print rows as JSON lines (datetimes and enums as their JSON forms)."""
    for row in rows:
        typer.echo(orjson.dumps(row, option=orjson.OPT_NON_STR_KEYS).decode())


def print_rows(rows: list[dict[str, Any]], title: str | None = None) -> None:
    """Print rows of any shape as a rich table with one column per key.

    Id columns (`session_id`, `call_id`, ... : names ending in `id`) are never cut or wrapped, so an id
    can be copied from the table; the other columns share what room is left.
    """
    table = Table(title=title)
    for name in rows[0] if rows else ("(no rows)",):
        if str(name).endswith("id"):
            width = max((len(_cell(r[name])) for r in rows), default=0)
            table.add_column(str(name), no_wrap=True, min_width=max(width, len(str(name))))
        else:
            table.add_column(str(name), overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v) for v in row.values()))
    out.print(table)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, tuple | list):
        return ", ".join(map(str, value))
    return escape("" if value is None else str(value))


def _utc(value: datetime | None) -> datetime | None:
    """Options are parsed without a zone; they are read as UTC."""
    return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)


@app.command("list")
def list_sessions(
    db: Db = DEFAULT_DB,
    state: Annotated[SessionState | None, typer.Option(help="Only sessions in this state.")] = None,
    scenario: Annotated[str | None, typer.Option(help="Only sessions of this scenario.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100_000, help="How many sessions to show.")] = 20,
    as_json: Json = False,
) -> None:
    """The most recently created sessions."""
    with reporting(), open_store(db, create=False) as store:
        q = SessionQuery(state=state, scenario=scenario, limit=limit, order_by="created_at", descending=True)
        rows = store.query(q)
    if as_json:
        emit_json([dataclasses.asdict(r) for r in rows])
    else:
        out.print(sessions_table(rows, f"{len(rows)} most recent sessions"))


def sessions_table(rows: Sequence[SessionRow], title: str) -> Table:
    """One line per session; ids are never cut (the query text gives way to them)."""
    table = Table(title=f"{title} (calls: tool/LLM/feedback; created: UTC)")
    widths = {"session": max((cell_len(r.session_id) for r in rows), default=7), "state": 9}
    widths |= {
        "scenario": max((cell_len(r.scenario or "-") for r in rows), default=8),
        "calls": 6,
        "created": 11,
    }
    widths = {column: max(width, len(column)) for column, width in widths.items()}  # headers are never cut
    for column, width in widths.items():
        table.add_column(column, min_width=width, no_wrap=True)
    room = out.width - sum(widths.values()) - 3 * len(widths) - 4  # what the borders and padding leave
    query = room >= len("query")  # a terminal too narrow for it drops the query rather than the borders
    if query:
        table.add_column("query", overflow="ellipsis", no_wrap=True, max_width=room)
    for r in rows:
        calls = f"{r.n_tool_calls}/{r.n_llm_calls}/{r.n_feedback}"
        cells = [
            escape(r.session_id),
            r.state.value,
            escape(r.scenario or "-"),
            calls,
            f"{r.created_at:%m-%d %H:%M}",
        ]
        table.add_row(*cells, *([escape(r.user_query)] if query else []))
    return table


@app.command("show")
def show(session_id: str, db: Db = DEFAULT_DB, as_json: Json = False) -> None:
    """One session as a tree: plan, tool calls, LLM calls, feedback and final output."""
    with reporting(), open_store(db, create=False) as store:
        session = store.get(session_id)
    if as_json:
        typer.echo(codec.dumps(session).decode())
    else:
        out.print(session_tree(session))


def session_tree(s: Session) -> Tree:
    """A readable tree of a session."""
    v = s.versions
    tree = Tree(
        f"[bold]{escape(s.session_id)}[/bold] · {s.state.value} · {escape(s.scenario or '-')} "
        f"(v{s.state_version}: plan {v.plan}, execution {v.execution}, feedback {v.feedback})"
    )
    tree.add(f"query: {escape(s.user_query)}")
    if s.plan is not None:
        plan = tree.add(f"plan: {escape(s.plan.root_goal)}")
        for g in s.plan.subgoals:
            after = f" (after {', '.join(g.depends_on)})" if g.depends_on else ""
            plan.add(f"{escape(g.id)} {escape(g.description)} → {escape(g.tool or 'reasoning')}{after}")
    calls = tree.add(f"tool calls ({len(s.tool_calls)})")
    for c in s.tool_calls:
        mark = "[green]✓[/green]" if c.status is CallStatus.SUCCESS else f"[red]✗ {c.status.value}[/red]"
        detail = f" {escape(c.error_code or '')}: {escape(c.error_message or '')}" if c.error_code else ""
        retry = " (retryable)" if c.retryable else ""
        calls.add(f"{mark} {escape(c.call_id)} {escape(c.tool)} {c.latency_ms:.0f} ms{detail}{retry}")
    llm = tree.add(f"LLM calls ({len(s.llm_calls)})")
    for m in s.llm_calls:
        llm.add(_llm_line(m))
    feedback = tree.add(f"feedback ({len(s.feedback)})")
    for f in s.feedback:
        score = "" if f.score is None else f" {f.score:g}"
        said = f' "{escape(f.comment)}"' if f.comment else ""
        feedback.add(
            f"{f.type.value}{score} by {escape(f.annotator or '?')} on {escape(f.anchor.key)}{said}"
            f" · happened {f.occurred_at:%Y-%m-%d %H:%M}, arrived {f.received_at:%Y-%m-%d %H:%M}"
        )
    if s.final_output is not None:
        output = tree.add(f"output: {escape(s.final_output.text)}")
        for claim in s.final_output.claims:
            output.add(f"{escape(claim.text)} ← {escape(', '.join(claim.call_ids) or 'no source')}")
    return tree


def _llm_line(m: LLMCall) -> str:
    """One LLM call: a mark for its status, its tokens ("tokens unknown" when its server did not say)
    and, for a failed call, why."""
    ok = m.status is CallStatus.SUCCESS
    mark = "[green]✓[/green]" if ok else f"[red]✗ {m.status.value}[/red]"
    tokens = "tokens unknown" if m.tokens_used is None else f"{m.tokens_used} tokens"
    why = "" if ok else f": {escape(m.error_message or 'no reason given')}"
    return f"{mark} {escape(m.call_id)} {escape(m.purpose)} · {tokens} · {_policy(m.policy_version)}{why}"


def _tool_share(text: str | None) -> ToolShare | None:
    """The `--tool-share` bound, or a usage error saying what is expected."""
    if text is None:
        return None
    try:
        return ToolShare.parse(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tool-share") from None


def _policy(version: int | None) -> str:
    """Which policy made an LLM call: its version, or that the call named none (a model outside training)."""
    return "policy version not recorded" if version is None else f"policy v{version}"


@app.command("query")
def query(
    db: Db = DEFAULT_DB,
    state: Annotated[SessionState | None, typer.Option(help="Sessions in this state.")] = None,
    scenario: Annotated[str | None, typer.Option(help="Sessions of this scenario.")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Sessions carrying this tag (repeatable).")] = None,
    user: Annotated[str | None, typer.Option(help="Sessions of this user id.")] = None,
    tool: Annotated[str | None, typer.Option(help="Sessions that called this tool.")] = None,
    failed_tool: Annotated[
        str | None, typer.Option(help="Sessions where a call to this tool failed.")
    ] = None,
    tool_share: Annotated[
        str | None,
        typer.Option(
            help="Sessions in which a tool's share of their own tool calls is bounded, such as "
            "'crp_test_request<0.3' (or <=, >, >=).",
        ),
    ] = None,
    feedback_type: Annotated[FeedbackType | None, typer.Option(help="Feedback of this type.")] = None,
    comment_contains: Annotated[str | None, typer.Option(help="Feedback comment contains this text.")] = None,
    comment_mentions: Annotated[
        str | None,
        typer.Option(help="Feedback comment contains this text, or its translation for a glossary term."),
    ] = None,
    min_score: Annotated[float | None, typer.Option(help="Feedback score at least this.")] = None,
    max_score: Annotated[float | None, typer.Option(help="Feedback score at most this.")] = None,
    created_after: Annotated[datetime | None, typer.Option(help="Created at or after (UTC).")] = None,
    created_before: Annotated[datetime | None, typer.Option(help="Created before (UTC).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100_000, help="Most rows to list.")] = 50,
    fraction_called: Annotated[
        str | None,
        typer.Option(help="Print how many sessions match and the fraction of them that called this tool."),
    ] = None,
    sql: Annotated[str | None, typer.Option("--sql", help="Run one read-only SELECT instead.")] = None,
    as_json: Json = False,
) -> None:
    """Sessions matching typed filters (feedback filters hold for one same feedback item), or raw SQL.

    SQL sees the query tables `sessions`, `session_tags`, `tool_calls`, `llm_calls`, `feedback`,
    `rewards`, the log `events` and the glossary's views `glossary` and `comment_terms`; statements that
    would write are refused.
    """
    filters = {
        "state": state, "scenario": scenario, "tags": tuple(tag or ()), "user_id": user, "tool_called": tool,
        "tool_failed": failed_tool, "tool_share": _tool_share(tool_share), "feedback_type": feedback_type,
        "comment_contains": comment_contains, "comment_mentions": comment_mentions,
        "min_score": min_score, "max_score": max_score,
        "created_after": _utc(created_after), "created_before": _utc(created_before),
    }  # fmt: skip
    given = {k: v for k, v in filters.items() if v not in (None, ())}
    if sql is not None and (given or fraction_called):
        raise typer.BadParameter("--sql cannot be combined with typed filters", param_hint="--sql")
    with reporting(), open_store(db, create=False) as store:
        if sql is not None:
            rows = store.sql(sql)
        elif fraction_called is not None:
            of = SessionQuery(**given)
            matched = store.count(of)
            share = store.fraction(of, SessionQuery(tool_called=fraction_called))
            rows = [{"matched": matched, "called": round(share * matched), "fraction": share}]
        else:
            sessions = store.query(SessionQuery(**given, limit=limit))
            if not as_json:
                out.print(sessions_table(sessions, f"{len(sessions)} matching session(s)"))
                return
            rows = [dataclasses.asdict(r) for r in sessions]
    if as_json:
        emit_json(rows)
    else:
        print_rows(rows, title=f"{len(rows)} row(s)")


@app.command("import")
def import_(
    path: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="JSON Lines or JSON file to import.")
    ],
    db: Db = DEFAULT_DB,
    fmt: Annotated[
        ImportFormat,
        typer.Option("--format", help="sessionrl's records, or traces: otlp, langfuse, langsmith."),
    ] = ImportFormat.SESSIONRL,
) -> None:
    """Import a file of events or sessions, all of it or nothing.

    The file is JSON Lines or one JSON document (an object or an array, pretty-printed or not). A record
    is an event envelope `{"session_id": ..., "event": {...}}` (what `export` writes), a session document
    (what `export --documents` writes), the design document's session shape, or an OpenAI chat
    transcript (see `sessionrl.capture.importers`). Every record is checked against the store before
    anything is written; bad records are reported with their line number, field and rule.
    """
    read = read_file(fmt, path.read_bytes())
    for w in read.warnings:  # what was left out, or kept with a caveat
        err.print(
            f"[yellow]warning:[/yellow] line {w.line}: {escape(w.field)}: {escape(w.rule)}", soft_wrap=True
        )
    with reporting(), open_store(db) as store:
        plan = plan_import(store, read.records)
        plan.problems += read.problems
        plan.problems.sort(key=lambda p: p.line)
        if plan.problems:
            bad = len({p.line for p in plan.problems})
            title = f"{bad} bad line(s), {len(plan.problems)} problem(s); nothing imported"
            table = Table("line", "field", "rule", title=title)
            for p in plan.problems:
                table.add_row(str(p.line), escape(p.field), escape(p.rule))
            err.print(table)
            raise typer.Exit(1)
        written = apply_import(store, plan)
    out.print(
        f"imported {written} event(s) for {len(plan.sessions)} session(s); "
        f"{plan.already_stored} already stored; {warning_summary(read.warnings)}"
    )


@app.command("export")
def export(
    path: Annotated[Path, typer.Argument(dir_okay=False, help="JSONL file to write.")],
    db: Db = DEFAULT_DB,
    state: Annotated[SessionState | None, typer.Option(help="Only sessions in this state.")] = None,
    documents: Annotated[
        bool, typer.Option("--documents", help="Write session documents instead of event logs.")
    ] = False,
    fmt: Annotated[
        ExportFormat, typer.Option("--format", help="jsonl, or otlp: OTLP/JSON, one request per session.")
    ] = ExportFormat.JSONL,
) -> None:
    """Export sessions as event envelopes (lossless, re-importable) or as session documents."""
    with reporting(), open_store(db, create=False) as store:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            lines = (
                otlp_lines(store, state=state)
                if fmt is ExportFormat.OTLP
                else export_lines(store, state=state, documents=documents)
            )
            count = sum(handle.write(line + b"\n") > 0 for line in lines)
    out.print(f"wrote {count} line(s) to {path}")


# import and export


@dataclass
class ImportPlan:
    """The events an import would append, in file order, or the problems that stop it."""

    items: list[tuple[str, Event]] = field(default_factory=list)
    sessions: set[str] = field(default_factory=set)
    already_stored: int = 0
    problems: list[ImportProblem] = field(default_factory=list)


class BadLine(Exception):
    """Everything wrong with one import line, as (field, rule) pairs: all of a line's validation errors
    are reported at once, so a file is fixed in one pass rather than one error per attempt."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{where}: {rule}" for where, rule in problems))
        self.problems = list(problems)

    @classmethod
    def of(cls, exc: ValidationError, prefix: str = "") -> BadLine:
        """Every error of a pydantic validation, each naming its field (under `prefix`) and rule."""
        found = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"])
            found.append(
                (f"{prefix}{where}" if where else prefix.rstrip(".") or "line", f"{e['msg']} ({e['type']})")
            )
        return cls(found)


def line_events(raw: bytes) -> list[tuple[str, Event]]:
    """The (session id, event) pairs one import line stands for; `BadLine` says everything wrong with it."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadLine([("line", f"malformed JSON: {exc}")]) from exc
    if not isinstance(doc, dict):
        raise BadLine([("line", "expected a JSON object")])
    if "event" not in doc:
        try:
            session = load_session(doc)
        except ValidationError as exc:
            raise BadLine.of(exc) from exc
        return [(session.session_id, e) for e in document_events(session)]
    unknown = sorted(set(doc) - {"session_id", "seq", "event"})
    if unknown:
        raise BadLine([(name, "unknown field in an event envelope") for name in unknown])
    sid = doc.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise BadLine([("session_id", "a non-empty string is required")])
    if not isinstance(doc["event"], dict):
        raise BadLine([("event", "expected a JSON object")])
    try:
        event = EVENT_ADAPTER.validate_python(doc["event"])
    except ValidationError as exc:
        raise BadLine.of(exc, prefix="event.") from exc
    if isinstance(event, SessionCreated) and event.session_id != sid:
        raise BadLine([("session_id", f"the event creates {event.session_id!r}, not {sid!r}")])
    return [(sid, event)]


def plan_import(store: SessionStore, lines: Sequence[tuple[int, bytes]]) -> ImportPlan:
    """Check every (line number, record) against the store, as if appended in order; nothing is written."""
    plan = ImportPlan()
    parsed: list[tuple[int, str, Event]] = []
    for number, raw in lines:
        if raw.strip():
            try:
                parsed += [(number, sid, event) for sid, event in line_events(raw)]
            except BadLine as exc:
                plan.problems += [ImportProblem(number, where, rule) for where, rule in exc.problems]
    owners = stored_owners(store, [event.event_id for _, _, event in parsed])
    views: dict[str, Session | None] = {}
    for number, sid, event in parsed:
        owner = owners.get(event.event_id)
        if owner is not None:
            if owner == sid:
                plan.already_stored += 1
            else:
                plan.problems.append(
                    ImportProblem(number, "event.event_id", f"already used by session {owner!r}")
                )
            continue
        if sid not in views:
            views[sid] = _stored(store, sid)
        try:
            views[sid] = apply(views[sid], event)
        except InvalidEvent as exc:
            plan.problems.append(ImportProblem(number, f"event.{exc.field}", exc.rule))
            continue
        except InvalidTransition as exc:
            plan.problems.append(ImportProblem(number, "event.type", str(exc)))
            continue
        owners[event.event_id] = sid
        plan.items.append((sid, event))
        plan.sessions.add(sid)
    return plan


def stored_owners(store: SessionStore, event_ids: Sequence[str]) -> dict[str, str]:
    """The session each already-stored event id belongs to."""
    owners: dict[str, str] = {}
    unique = list(dict.fromkeys(event_ids))
    for start in range(0, len(unique), 500):
        part = unique[start : start + 500]
        marks = ",".join("?" * len(part))
        rows = store.sql(f"SELECT event_id, session_id FROM events WHERE event_id IN ({marks})", tuple(part))
        owners.update((r["event_id"], r["session_id"]) for r in rows)
    return owners


def _stored(store: SessionStore, session_id: str) -> Session | None:
    try:
        return store.get(session_id)
    except NotFound:
        return None


def apply_import(store: SessionStore, plan: ImportPlan) -> int:
    """Append a checked import in one transaction; return how many events were written."""
    results = store.append_batch([(sid, event, None) for sid, event in plan.items])
    failed = [r for r in results if isinstance(r, SessionRLError)]
    if failed:
        raise failed[0]  # only possible when another writer changed the store after the check
    return len(results)


def export_lines(store: SessionStore, *, state: SessionState | None, documents: bool) -> Iterator[bytes]:
    """Canonical JSON lines: event envelopes per session in log order, or session documents."""
    if documents:
        yield from (codec.dumps(s) for s in store.iter_sessions(state))
        return
    for sid in store.session_ids(state):
        for e in store.events(sid):
            yield codec.dumps({"session_id": sid, "seq": e.seq, "event": e.event.model_dump(mode="json")})
