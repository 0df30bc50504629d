"""`sessionrl sessions ...` and `sessionrl store ...` (the store demo too), driven through typer's runner."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import Result
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.errors import SessionRLError
from sessionrl.session import CallStatus, LLMCall, LLMCallRecorded, Session, SessionCreate, StateChanged, fold
from sessionrl.store import SessionStore
from sessionrl.store.synthetic import generate, ingest

SEED = 4
N = 300
runner = CliRunner()

CHRONIC_SQL = """
SELECT COUNT(*) AS matched,
       SUM(s.session_id IN (SELECT session_id FROM tool_calls WHERE tool = 'crp_test_request')) AS called
FROM sessions s
WHERE s.session_id IN (SELECT session_id FROM feedback WHERE comment LIKE '%chronic disease%')
"""


def run(*args: str) -> Result:
    return runner.invoke(app, list(args))


def json_lines(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [orjson.loads(line) for line in result.stdout.splitlines() if line.strip()]


def url_of(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def sessions() -> list[Session]:
    return [fold(events) for events in generate(N, seed=SEED)]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A file store holding the N generated sessions; tests that change a store use their own."""
    url = url_of(tmp_path_factory.mktemp("cli") / "sessions.db")
    with SessionStore.open(url) as store:
        ingest(store, N, seed=SEED)
    return url


def test_chronic_question_typed_and_sql_agree(db: str, sessions: list[Session]) -> None:
    typed = json_lines(
        run("sessions", "query", "--db", db, "--comment-contains", "chronic disease",
            "--fraction-called", "crp_test_request", "--json")
    )  # fmt: skip
    sql = json_lines(run("sessions", "query", "--db", db, "--sql", CHRONIC_SQL, "--json"))
    mentioning = [
        s for s in sessions if any("chronic disease" in (f.comment or "").lower() for f in s.feedback)
    ]
    called = [s for s in mentioning if any(c.tool == "crp_test_request" for c in s.tool_calls)]
    assert 0 < len(called) < len(mentioning)  # the question is not degenerate for this seed
    assert sql == [{"matched": len(mentioning), "called": len(called)}]
    assert typed == [
        {"matched": len(mentioning), "called": len(called), "fraction": len(called) / len(mentioning)}
    ]


def test_list_shows_the_most_recent_first(db: str, sessions: list[Session]) -> None:
    rows = json_lines(run("sessions", "list", "--db", db, "--limit", "5", "--json"))
    newest = sorted(sessions, key=lambda s: s.created_at, reverse=True)[:5]
    assert [r["session_id"] for r in rows] == [s.session_id for s in newest]
    table = run("sessions", "list", "--db", db, "--limit", "3")
    assert table.exit_code == 0
    assert newest[0].session_id in table.stdout


def test_show_prints_plan_calls_and_feedback(db: str, sessions: list[Session]) -> None:
    s = next(s for s in sessions if s.feedback and s.final_output and s.plan)
    result = run("sessions", "show", s.session_id, "--db", db)
    assert result.exit_code == 0, result.output
    assert s.plan is not None
    for text in (s.plan.root_goal, *(g.id for g in s.plan.subgoals), *(c.call_id for c in s.tool_calls)):
        assert text in result.stdout
    assert f"feedback ({len(s.feedback)})" in result.stdout
    assert (
        json_lines(run("sessions", "show", s.session_id, "--db", db, "--json"))[0]["session_id"]
        == s.session_id
    )


def test_show_unknown_session_fails_cleanly(db: str) -> None:
    result = run("sessions", "show", "s-none", "--db", db)
    assert result.exit_code == 1
    assert "not found" in result.output


def test_typed_filters_select_what_they_say(db: str, sessions: list[Session]) -> None:
    rows = json_lines(run("sessions", "query", "--db", db, "--failed-tool", "refund.trigger", "--json"))
    expected = {
        s.session_id
        for s in sessions
        if any(c.tool == "refund.trigger" and c.status is not CallStatus.SUCCESS for c in s.tool_calls)
    }
    assert expected
    assert {r["session_id"] for r in rows} == expected
    low = json_lines(
        run("sessions", "query", "--db", db, "--feedback-type", "human_rating", "--max-score", "2",
            "--scenario", "clinical_triage", "--limit", "1000", "--json")
    )  # fmt: skip
    assert {r["session_id"] for r in low} == {
        s.session_id
        for s in sessions
        if s.scenario == "clinical_triage"
        and any(f.type == "human_rating" and (f.score or 0) <= 2 for f in s.feedback)
    }


def test_tag_and_time_filters(db: str, sessions: list[Session]) -> None:
    cut = datetime(2025, 3, 20, tzinfo=UTC)
    rows = json_lines(
        run("sessions", "query", "--db", db, "--tag", "clinic", "--tag", "triage",
            "--created-after", "2025-03-20T00:00:00", "--limit", "1000", "--json")
    )  # fmt: skip
    expected = {s.session_id for s in sessions if s.scenario == "clinical_triage" and s.created_at >= cut}
    assert expected
    assert {r["session_id"] for r in rows} == expected


def test_contradictory_filters_are_refused(db: str) -> None:
    result = run("sessions", "query", "--db", db, "--min-score", "4", "--max-score", "2")
    assert result.exit_code == 1
    assert "options: Value error, min_score is greater than max_score" in result.output


def test_sql_is_read_only_and_exclusive_with_filters(db: str) -> None:
    refused = run("sessions", "query", "--db", db, "--sql", "DELETE FROM sessions")
    assert refused.exit_code == 1
    assert "only SELECT" in refused.output
    mixed = run("sessions", "query", "--db", db, "--sql", "SELECT 1", "--state", "finished")
    assert mixed.exit_code == 2
    assert json_lines(
        run("sessions", "query", "--db", db, "--sql", "SELECT count(*) AS n FROM sessions", "--json")
    ) == [{"n": N}]


def test_export_then_import_of_events_is_lossless(db: str, tmp_path: Path, sessions: list[Session]) -> None:
    dump = tmp_path / "events.jsonl"
    assert run("sessions", "export", str(dump), "--db", db).exit_code == 0
    target = url_of(tmp_path / "copy.db")
    first = run("sessions", "import", str(dump), "--db", target)
    assert first.exit_code == 0, first.output
    with SessionStore.open(target) as copy:
        assert [copy.get(s.session_id) for s in sessions] == sessions
        events = copy.sql("SELECT count(*) AS n FROM events")
    again = run("sessions", "import", str(dump), "--db", target)
    assert again.exit_code == 0
    assert f"imported 0 event(s) for 0 session(s); {events[0]['n']} already stored" in again.stdout


def test_import_of_documents_keeps_the_content(db: str, tmp_path: Path, sessions: list[Session]) -> None:
    dump = tmp_path / "documents.jsonl"
    assert run("sessions", "export", str(dump), "--db", db, "--documents").exit_code == 0
    assert len(dump.read_bytes().splitlines()) == N
    target = url_of(tmp_path / "docs.db")
    result = run("sessions", "import", str(dump), "--db", target)
    assert result.exit_code == 0, result.output
    renumbered = {"state_version", "versions", "updated_at"}  # the fold of the rebuilt log numbers them anew
    with SessionStore.open(target) as copy:
        for s in sessions:
            assert copy.get(s.session_id).model_dump(exclude=renumbered) == s.model_dump(exclude=renumbered)


def test_bad_lines_are_reported_and_nothing_is_written(tmp_path: Path, sessions: list[Session]) -> None:
    events = next(iter(generate(1, seed=SEED)))
    good = {"session_id": sessions[0].session_id, "event": events[0].model_dump(mode="json")}
    call = events[6].model_dump(mode="json")
    assert call["type"] == "tool_call"
    bad_status = {
        "session_id": sessions[0].session_id,
        "event": {**call, "call": {**call["call"], "status": "maybe"}},
    }
    orphan = {"session_id": "s-nobody", "event": call}
    lines = [orjson.dumps(good), b"{not json", orjson.dumps(bad_status), orjson.dumps(orphan)]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    target = url_of(tmp_path / "empty.db")
    result = run("sessions", "import", str(path), "--db", target)
    assert result.exit_code == 1
    assert "3 bad line(s), 3 problem(s); nothing imported" in result.output
    assert "malformed JSON" in result.output
    assert "event.tool_call.call.status" in result.output
    assert "needs an existing session" in result.output
    with SessionStore.open(target) as store:
        assert store.session_ids() == []


def test_pretty_printed_json_is_read_as_one_document(tmp_path: Path) -> None:
    events = next(iter(generate(1, seed=SEED)))
    sid = events[0].session_id
    records = [{"session_id": sid, "event": e.model_dump(mode="json")} for e in events[:3]]
    for name, data, count in (("array.json", records, 3), ("one.json", records[0], 1)):
        path = tmp_path / name
        path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
        assert len(path.read_bytes().splitlines()) > 10
        result = run("sessions", "import", str(path), "--db", url_of(tmp_path / f"{name}.db"))
        assert result.exit_code == 0, result.output
        assert f"imported {count} event(s) for 1 session(s)" in result.output


def test_every_problem_of_a_line_is_reported_at_once(tmp_path: Path, sessions: list[Session]) -> None:
    call = next(iter(generate(1, seed=SEED)))[6].model_dump(mode="json")
    broken = {**call["call"], "status": "maybe", "latency_ms": "slow"}
    path = tmp_path / "bad.jsonl"
    path.write_bytes(orjson.dumps({"session_id": sessions[0].session_id, "event": {**call, "call": broken}}))
    result = runner.invoke(app, ["sessions", "import", str(path), "--db", url_of(tmp_path / "s.db")],
                           terminal_width=200)  # fmt: skip
    assert result.exit_code == 1
    assert "1 bad line(s), 2 problem(s); nothing imported" in result.output
    assert "event.tool_call.call.status" in result.output
    assert "event.tool_call.call.latency_ms" in result.output


def test_ids_are_never_cut_in_an_80_column_table(tmp_path: Path) -> None:
    url = url_of(tmp_path / "ids.db")
    long_id = "session-" + "x" * 40
    with SessionStore.open(url) as store:
        store.create(SessionCreate(user_query="a question long enough to be cut " * 3, session_id=long_id))
    for command in (["list"], ["query"], ["query", "--sql", "SELECT session_id, user_query FROM sessions"]):
        result = runner.invoke(app, ["sessions", *command, "--db", url], terminal_width=80)
        assert result.exit_code == 0, result.output
        assert long_id in result.stdout, command


def test_show_names_a_missing_policy_version_in_words(tmp_path: Path) -> None:
    url = url_of(tmp_path / "llm.db")
    with SessionStore.open(url) as store:
        store.create(SessionCreate(user_query="q", session_id="s-1"))
        store.append("s-1", StateChanged(state="executing"))
        store.append("s-1", LLMCallRecorded(call=LLMCall(call_id="m1", purpose="plan", response="r")))
        store.append("s-1", LLMCallRecorded(
            call=LLMCall(call_id="m2", purpose="plan", response="r", policy_version=3)))  # fmt: skip
    shown = runner.invoke(app, ["sessions", "show", "s-1", "--db", url], terminal_width=200).stdout
    assert "vNone" not in shown
    assert "m1 plan · tokens unknown · policy version not recorded" in shown  # no usage: not "0 tokens"
    assert "m2 plan · tokens unknown · policy v3" in shown


def test_store_check_finds_and_repairs_drift(tmp_path: Path) -> None:
    path = tmp_path / "drift.db"
    with SessionStore.open(url_of(path)) as store:
        ingest(store, 20, seed=SEED)
        store.project()
        victim = store.session_ids()[3]
    assert run("store", "check", "--db", url_of(path)).exit_code == 0
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE sessions SET n_tool_calls = n_tool_calls + 1 WHERE session_id = ?", (victim,))
    broken = run("store", "check", "--db", url_of(path))
    assert broken.exit_code == 1
    assert victim in broken.stdout
    repaired = run("store", "check", "--db", url_of(path), "--repair")
    assert repaired.exit_code == 0, repaired.output
    assert "1 repaired" in repaired.stdout
    assert run("store", "check", "--db", url_of(path)).exit_code == 0


def test_store_archive_then_check_against_the_archive(tmp_path: Path) -> None:
    url = url_of(tmp_path / "a.db")
    with SessionStore.open(url) as store:
        ingest(store, 20, seed=SEED)
        done = len(store.session_ids("finished")) + len(store.session_ids("rejected"))
    result = run("store", "archive", str(tmp_path / "archive"), "--db", url)
    assert result.exit_code == 0, result.output
    assert f"archived {done} session(s)" in result.stdout
    assert run("store", "check", "--db", url, "--archive", str(tmp_path / "archive")).exit_code == 0


def test_demo_answers_every_question(tmp_path: Path) -> None:
    result = run("store", "demo", "--sessions", "120", "--out", str(tmp_path / "demo"))
    assert result.exit_code == 0, result.output
    for title in ("crp_test_request", "Tool failure rates", "Human ratings by scenario", "Slowest tools"):
        assert title in result.stdout
    assert "NO" not in result.stdout
    with SessionStore.open(url_of(tmp_path / "demo" / "sessions.db")) as store:
        assert len(store.session_ids()) == 120


def test_a_store_url_no_backend_serves_is_one_line_naming_the_known_schemes() -> None:
    result = run("sessions", "list", "--db", "mysql://localhost/db")
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: store URL 'mysql://localhost/db'")
    assert "known: " in line
    assert "sqlite://" in line


def test_an_error_of_several_lines_is_printed_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(url: str) -> SessionStore:
        raise SessionRLError(f"store URL {url!r}: cannot connect: refused\n\tIs the server running?")

    monkeypatch.setattr(SessionStore, "open", refuse)
    result = run("sessions", "list", "--db", "postgresql://localhost/db")
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: store URL 'postgresql://localhost/db': cannot connect: refused Is the server running?"
    ]


def test_the_list_keeps_its_borders_with_wide_text_and_short_values(tmp_path: Path) -> None:
    """A Chinese query (two cells a character) and a one-letter scenario, at 80 columns: every line of the
    table is as wide as the terminal, ends with its border, and no header is cut."""
    from rich.cells import cell_len

    db = url_of(tmp_path / "cjk.db")
    with SessionStore.open(db) as store:
        store.create(
            SessionCreate(user_query="患者张三，男，65岁，血常规显示Hb 85g/L，请生成贫血鉴别诊断路径。")
        )
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["sessions", "list", "--db", db])
    assert result.exit_code == 0, result.output
    table = [line.rstrip() for line in result.output.splitlines() if line[:1] in "┏┃┡│└"]
    assert len(table) == 5
    assert len({cell_len(line) for line in table}) == 1  # one width: no line cut short
    assert max(cell_len(line) for line in table) <= 80
    assert all(line[-1] in "┓┃┩│┘" for line in table)
    assert "scenario" in table[1]
    assert "患者" in table[3]  # the query gives way, cut at a whole character
