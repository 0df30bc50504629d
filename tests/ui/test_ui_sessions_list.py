"""The session list over HTTP: its columns and filters (verdict, failed calls, error code, reward by
ruleset, duration, policy version, scenario part, a run's stage), free-text search with the glossary, and
the JSON API that `/docs` documents under `sessionrl ui`."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sessions_support import SEED_ID, episode, fill, import_seed
from ui_support import READER, TOKENS

from sessionrl.service import parse_tokens
from sessionrl.store import SessionStore
from sessionrl.ui import UIConfig, create_ui_app


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("list")
    fill(root / "s.db", root / "runs")
    app = create_ui_app(f"sqlite:///{root / 's.db'}", UIConfig(runs_dir=root / "runs"), parse_tokens(TOKENS))
    with TestClient(app, headers={"Authorization": f"Bearer {READER}"}) as opened:
        yield opened


def listed(client: TestClient, query: str) -> list[str]:
    """Session ids the list page shows for a query string, in page order."""
    answer = client.get(f"/ui/sessions?{query}")
    assert answer.status_code == 200, answer.text
    assert 'role="alert"' not in answer.text, answer.text
    return re.findall(r'<a href="/ui/(?:runs/\w+/)?sessions/([^"/]+)">', answer.text)


def data(client: TestClient, query: str) -> dict[str, object]:
    answer = client.get(f"/ui/api/sessions?{query}")
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def test_a_failed_task_shows_as_failed_and_is_found_by_its_outcome(client: TestClient) -> None:
    assert listed(client, "outcome=failed") == ["failed-1"]
    assert listed(client, "outcome=solved") == ["solved-1"]
    assert sorted(listed(client, "outcome=unjudged")) == ["judged-1", SEED_ID]
    page = client.get("/ui/sessions?outcome=failed").text
    assert "finished · failed" in page
    assert 'outcome-failed">finished<' not in page  # a judged session never shows as a plain "finished"


def test_failed_calls_and_error_codes_count_a_reply_the_parser_refused(client: TestClient) -> None:
    assert sorted(listed(client, "failed=1")) == ["failed-1", "judged-1"]
    assert listed(client, "error=UNAVAILABLE") == ["failed-1"]
    assert listed(client, "error=UNPARSEABLE_ACTION") == ["judged-1"]
    rows = {r["session_id"]: r for r in data(client, "failed=1")["rows"]}  # type: ignore[attr-defined]
    assert rows["judged-1"]["failed_calls"] == 1
    assert rows["judged-1"]["errors"] == ["UNPARSEABLE_ACTION"]


def test_reward_bounds_read_the_latest_reward_or_the_chosen_rulesets(client: TestClient) -> None:
    assert listed(client, "min_reward=0.5") == ["solved-1"]
    assert listed(client, "max_reward=0.2") == ["failed-1"]  # its latest (r2) is +0.1
    assert listed(client, "max_reward=0&reward_version=r1") == ["failed-1"]  # r1's is -0.5
    assert listed(client, "max_reward=0") == []
    rows = {r["session_id"]: r for r in data(client, "reward_version=r1")["rows"]}  # type: ignore[attr-defined]
    assert (rows["failed-1"]["reward"], rows["failed-1"]["reward_ruleset"]) == (-0.5, "r1")


def test_duration_policy_and_scenario_part(client: TestClient) -> None:
    # failed-1: tool 2500 ms then LLM 20 ms; solved-1: 100 + 20 ms
    assert listed(client, "min_ms=2000&max_ms=3000") == ["failed-1"]  # the seed ran for seconds
    assert listed(client, "max_ms=120") == ["solved-1"]
    rows = {r["session_id"]: r for r in data(client, "min_ms=2000&max_ms=3000")["rows"]}  # type: ignore[attr-defined]
    assert rows["failed-1"]["duration_ms"] == 2520.0
    assert listed(client, "policy=4") == ["judged-1"]
    assert sorted(listed(client, "scenario=orders")) == ["failed-1", "solved-1"]  # a prefix
    assert listed(client, "scenario=ADDR") == ["failed-1"]  # a part, ASCII case ignored


def test_free_text_search_reaches_every_text_and_the_glossary(client: TestClient) -> None:
    assert listed(client, "q=chronic+disease") == [SEED_ID]  # the comment says 慢性病
    assert listed(client, "q=anemia") == [SEED_ID]  # 贫血: two characters, found by a scan
    assert listed(client, "q=%E8%A1%80%E5%B8%B8%E8%A7%84") == [SEED_ID]  # 血常规, in the query
    assert listed(client, "q=ACG") == [SEED_ID]  # in a tool's output only
    assert listed(client, "q=depot") != []  # tool outputs of the generated episodes
    assert listed(client, "q=depot+solved-1") == ["solved-1"]  # every word must be found
    assert listed(client, "q=nowhere-to-be-found") == []


def test_a_runs_sessions_by_stage(client: TestClient) -> None:
    assert sorted(listed(client, "run=r1&stage=rl")) == ["rl-0", "rl-1", "rl-2"]
    assert listed(client, "run=r1&stage=eval&outcome=failed") == ["eval-0"]
    page = client.get("/ui/sessions?run=r1&stage=rl").text
    assert 'href="/ui/runs/r1/sessions/rl-0"' in page
    assert 'data-live="/ui/sessions/live?run=r1"' in page
    assert client.get("/ui/sessions?run=nosuch").status_code == 404


def test_the_list_links_the_same_filters_in_each_runs_store(client: TestClient) -> None:
    # no failed evaluation in the dashboard's store, but the run's store holds one: the link to
    # it keeps the filters, so the failed evaluation is one click away
    page = client.get("/ui/sessions?outcome=failed&stage=eval&page=1").text
    assert re.search(r'<b id="found">0</b>', page)
    link = re.search(r'<a href="/ui/sessions\?([^"]+)" data-run="r1">run r1</a>', page)
    assert link is not None
    assert listed(client, link.group(1).replace("&amp;", "&")) == ["eval-0"]
    assert "page=" not in link.group(1)
    back = client.get("/ui/sessions?outcome=failed&run=r1").text
    assert '<a href="/ui/sessions?outcome=failed">the dashboard\'s store</a>' in back
    assert "<b>run r1</b>" in back


def test_state_counts_link_to_the_list_of_that_state(client: TestClient) -> None:
    page = client.get("/ui/sessions?run=r1").text
    assert 'href="/ui/sessions?run=r1&amp;state=finished"' in page


def test_a_bad_filter_is_named_and_the_api_says_422(client: TestClient) -> None:
    page = client.get("/ui/sessions?outcome=maybe").text
    assert 'role="alert"' in page
    assert "outcome" in page
    assert client.get("/ui/api/sessions?min_ms=-1").status_code == 422
    assert client.get("/ui/api/sessions", headers={"Authorization": ""}).status_code == 401


def test_the_docs_of_the_dashboard_alone_list_its_api(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert "/ui/api/sessions" in spec["paths"]
    assert data(client, "q=chronic+disease")["total"] == 1


def test_the_list_answers_alike_over_postgresql(tmp_path_factory: pytest.TempPathFactory) -> None:
    from pg_support import local_postgres

    root = tmp_path_factory.mktemp("pg-list")
    with local_postgres("ui_list") as server:
        url = server.url("ui_list")
        import_seed(url)
        with SessionStore.open(url) as store:
            episode(store, "failed-1", scenario="orders-address", solved=False, error="UNAVAILABLE")
            episode(store, "judged-1", scenario="clinic-triage", solved=None, unparseable=True, policy=4)
            store.save_reward("failed-1", {"session_reward": -0.5}, "r1")
        app = create_ui_app(url, UIConfig(runs_dir=root), parse_tokens(TOKENS))
        with TestClient(app, headers={"Authorization": f"Bearer {READER}"}) as pg:
            assert listed(pg, "outcome=failed") == ["failed-1"]
            assert listed(pg, "q=chronic+disease") == [SEED_ID]
            assert listed(pg, "q=anemia") == [SEED_ID]
            assert listed(pg, "error=UNPARSEABLE_ACTION&policy=4") == ["judged-1"]
            assert listed(pg, "max_reward=0&scenario=ADDR") == ["failed-1"]
            assert "finished · failed" in pg.get("/ui/sessions?outcome=failed").text
