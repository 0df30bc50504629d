"""The seed's question, typed and in SQL, in English and in Chinese: sessions whose expert comment
mentions chronic disease, in which `crp_test_request` was under 30% of the session's own tool calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.store.query import ToolShare

SEED = Path(__file__).resolve().parents[2].parent / "shared" / "seed-examples" / "anemia-session.json"
runner = CliRunner()
ENGLISH = "correct diagnosis, but did not mention excluding anemia of chronic disease"
QUESTION_SQL = """
SELECT s.session_id FROM sessions s
WHERE s.session_id IN (SELECT session_id FROM comment_terms WHERE term = '{needle}'
                       UNION SELECT session_id FROM feedback WHERE comment LIKE '%{needle}%')
  AND s.session_id IN (
    SELECT session_id FROM tool_calls GROUP BY session_id
    HAVING SUM(CASE WHEN tool = 'crp_test_request' THEN 1 ELSE 0 END) < 0.3 * COUNT(*))
ORDER BY s.session_id
"""


def variant(session_id: str, comment: str, extra_tools: int = 0) -> dict[str, Any]:
    """The seed session under another id, with another comment and `extra_tools` CRP tests added."""
    doc = orjson.loads(SEED.read_bytes())
    crp = {**doc["tool_calls"][0], "tool_name": "crp_test_request", "input_params": {"patient_id": "p-1"}}
    calls = doc["tool_calls"] + [{**crp, "call_id": f"crp_{i}"} for i in range(extra_tools)]
    feedback = [{**doc["feedback"][0], "comment": comment}]
    return {**doc, "session_id": session_id, "tool_calls": calls, "feedback": feedback}


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A store holding the seed as it is, an English twin, and a Chinese twin that ordered CRP often."""
    path = tmp_path / "seed.json"
    path.write_bytes(SEED.read_bytes())
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    assert runner.invoke(app, ["sessions", "import", str(path), "--db", url]).exit_code == 0
    twins = [variant("sess_en", ENGLISH), variant("sess_crp", "需排除慢性病贫血", extra_tools=2)]
    (tmp_path / "twins.jsonl").write_bytes(b"\n".join(orjson.dumps(t) for t in twins))
    result = runner.invoke(app, ["sessions", "import", str(tmp_path / "twins.jsonl"), "--db", url])
    assert result.exit_code == 0, result.output
    return url


@pytest.mark.parametrize("needle", ["chronic disease", "慢性病"])
def test_the_typed_query_and_sql_return_the_seed_for_its_question_in_both_languages(
    db: str, needle: str
) -> None:
    args = ["sessions", "query", "--db", db, "--json", "--comment-mentions", needle]
    typed = runner.invoke(app, [*args, "--tool-share", "crp_test_request<0.3"])
    assert typed.exit_code == 0, typed.output
    expected = ["sess_abc123", "sess_en"]  # the seed (Chinese comment) and its English twin
    assert [r["session_id"] for r in map(orjson.loads, typed.stdout.splitlines())] == expected
    sql = runner.invoke(
        app, ["sessions", "query", "--db", db, "--json", "--sql", QUESTION_SQL.format(needle=needle)]
    )
    assert sql.exit_code == 0, sql.output
    assert [r["session_id"] for r in map(orjson.loads, sql.stdout.splitlines())] == expected
    with SessionStore.open(db) as store:
        everyone = store.query(SessionQuery(comment_mentions=needle))
    assert len(everyone) == 3  # the CRP-heavy twin mentions it too, but orders CRP half the time


@pytest.mark.parametrize(
    ("needle", "expected"), [("慢性病", ["sess_abc123", "sess_crp"]), ("chronic disease", ["sess_en"])]
)
def test_comment_contains_stays_a_literal_substring_test(db: str, needle: str, expected: list[str]) -> None:
    with SessionStore.open(db) as store:
        rows = store.query(SessionQuery(comment_contains=needle, order_by="session_id"))
    assert [r.session_id for r in rows] == expected


def test_the_glossary_view_lists_each_comment_s_terms_in_both_languages(db: str) -> None:
    with SessionStore.open(db) as store:
        rows = store.sql("SELECT term FROM comment_terms WHERE session_id = 'sess_abc123' ORDER BY term")
    terms = {r["term"] for r in rows}
    # 诊断正确，但未提及需排除慢性病贫血: diagnosis, chronic disease and anemia, each in both languages
    assert {"chronic disease", "慢性病", "anemia", "贫血", "diagnosis", "诊断"} <= terms
    assert "refund" not in terms


def test_a_tool_share_bound_counts_each_session_s_own_calls(db: str) -> None:
    with SessionStore.open(db) as store:

        def ids(bound: str) -> list[str]:
            return sorted(r.session_id for r in store.query(SessionQuery(tool_share=bound)))

        assert ids("crp_test_request<0.3") == ["sess_abc123", "sess_en"]  # 0 of 2 calls
        assert ids("crp_test_request>=0.5") == ["sess_crp"]  # 2 of 4 calls
        assert ids("crp_test_request>0.5") == []
        assert ids("lab_result_parser<=0.5") == ["sess_abc123", "sess_crp", "sess_en"]


def test_a_malformed_bound_is_a_usage_error_saying_what_is_expected(db: str) -> None:
    result = runner.invoke(
        app, ["sessions", "query", "--db", db, "--tool-share", "crp=0.3"], terminal_width=200
    )
    assert result.exit_code == 2
    assert "TOOL<SHARE" in result.output
    with pytest.raises(ValueError, match="less than or equal to 1"):
        ToolShare.parse("crp<3")
