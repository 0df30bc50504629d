"""The dashboard's pages over HTTP, without a browser: login and its cookie, what a page needs, and that
the dashboard has no route that writes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from ui_support import READER, TOKENS, tiny_run

from sessionrl.service import parse_tokens
from sessionrl.session import FeedbackAdded
from sessionrl.session.model import Feedback, FeedbackType, SessionCreate
from sessionrl.store import SessionStore, synthetic
from sessionrl.ui import UIConfig, create_ui_app, sessions, training
from sessionrl.ui.app import login_router
from sessionrl.ui.auth import safe_next


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with SessionStore.open(f"sqlite:///{tmp_path / 's.db'}") as store:
        synthetic.ingest(store, 12, seed=5)
    tiny_run(tmp_path / "runs" / "r1")
    app = create_ui_app(
        f"sqlite:///{tmp_path / 's.db'}", UIConfig(runs_dir=tmp_path / "runs"), parse_tokens(TOKENS)
    )
    with TestClient(app, follow_redirects=False) as opened:
        yield opened


def test_a_page_without_a_token_sends_the_browser_to_log_in_and_back(client: TestClient) -> None:
    answer = client.get("/ui/sessions?state=finished")
    assert answer.status_code == 303
    assert answer.headers["location"] == "/ui/login?next=%2Fui%2Fsessions%3Fstate%3Dfinished"
    refused = client.post("/ui/login", data={"token": "wrong", "next": "/ui/runs"})
    assert refused.status_code == 401
    assert "set-cookie" not in refused.headers
    accepted = client.post("/ui/login", data={"token": READER, "next": "/ui/runs"})
    assert (accepted.status_code, accepted.headers["location"]) == (303, "/ui/runs")
    cookie = accepted.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert client.get("/ui/runs").status_code == 200


def test_a_bearer_header_opens_the_pages_too(client: TestClient) -> None:
    answer = client.get("/ui/sessions", headers={"Authorization": f"Bearer {READER}"})
    assert answer.status_code == 200
    assert '<b id="found">12</b>' in answer.text


def test_after_login_only_paths_of_this_site_are_followed() -> None:
    assert safe_next("/ui/runs/x") == "/ui/runs/x"
    assert safe_next("https://elsewhere.example/") == "/ui/sessions"
    assert safe_next("//elsewhere.example/") == "/ui/sessions"


def test_bad_filters_and_unknown_things_answer_with_a_page(client: TestClient) -> None:
    client.post("/ui/login", data={"token": READER})
    bad = client.get("/ui/sessions?tool_share=nonsense")
    assert bad.status_code == 200  # the form again, with the problem named
    assert "expected TOOL&lt;SHARE" in bad.text
    assert client.get("/ui/sessions/s_nope").status_code == 404
    assert client.get("/ui/sessions/s_nope/rewards/1").status_code == 404
    assert client.get("/ui/runs/nope").status_code == 404
    assert client.get("/ui/runs/r1").status_code == 200
    assert client.get("/ui/evaluation").status_code == 200


def test_the_evaluation_page_shows_the_auto_pause_rules_state(client: TestClient, tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "falling"
    folder.mkdir()
    (folder / "config.yaml").write_text("evaluation:\n  auto_pause_falls: 3\n")
    records = [{"stage": "eval", "step": k, "time": 1.8e9 + k, "label": "rl", "tcsr": t, "spt": 4.0}
               for k, t in enumerate((0.9, 0.8, 0.7, 0.6))]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(orjson.dumps(r).decode() + "\n" for r in records))
    client.post("/ui/login", data={"token": READER})
    tripped = client.get("/ui/evaluation?label=rl").text
    assert 'data-state="tripped"' in tripped
    assert "tcsr fell 3 times in a row" in tripped
    assert "spt fell" not in tripped
    assert 'data-state="choose a policy"' in client.get("/ui/evaluation").text


def judged(store: SessionStore, label: str, task: str, score: float) -> None:
    """An evaluation episode of `label` on `task`, as a run's store keeps it, judged `score`."""
    session_id = f"eval-{label}-{task}"
    meta = {"stage": "eval", "label": label, "task_id": task}
    store.create(SessionCreate(user_query=task, session_id=session_id, metadata=meta))
    verdict = Feedback(type=FeedbackType.TASK_OUTCOME, score=score)
    store.append(session_id, FeedbackAdded(feedback=verdict))


def test_a_failed_held_out_task_links_to_its_session_in_the_runs_store(
    client: TestClient, tmp_path: Path
) -> None:
    with SessionStore.open(f"sqlite:///{tmp_path / 'runs' / 'r1' / 'sessions.db'}") as store:
        for label, task, score in (
            ("rl", "t1", 0.0),
            ("rl", "t2", 1.0),
            ("sft", "t1", 0.0),
            ("sft", "t2", 0.0),
        ):
            judged(store, label, task, score)
        store.create(SessionCreate(user_query="a rollout", session_id="rl-0-t1", metadata={"stage": "rl"}))
    client.post("/ui/login", data={"token": READER})
    run = client.get("/ui/runs/r1")
    assert run.status_code == 200
    links = re.findall(r'href="/ui/runs/r1/sessions/([^"]+)"', run.text)
    assert sorted(links) == ["eval-rl-t1", "eval-sft-t1", "eval-sft-t2"]
    row = re.search(r"<tr><td>rl vs sft</td>(.*?)</tr>", run.text)
    assert row is not None
    cells = re.findall(r'<td class="num">([^<]*)</td>', row.group(1))
    assert cells == ["2", "1", "0", "1.0000"]  # one discordant task: no evidence of a difference
    session = client.get("/ui/runs/r1/sessions/eval-rl-t1")
    assert session.status_code == 200
    assert "task_outcome" in session.text
    assert client.get("/ui/runs/r1/sessions/eval-rl-t9").status_code == 404


def test_what_sessions_say_is_shown_as_text_never_run_as_markup(client: TestClient) -> None:
    app_store = client.app.state.store  # type: ignore[attr-defined]
    app_store.create(SessionCreate(user_query="<script>alert(1)</script>", session_id="s-markup"))
    client.post("/ui/login", data={"token": READER})
    page = client.get("/ui/sessions/s-markup").text
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_the_dashboard_writes_nothing() -> None:
    routers = (login_router(), sessions.router, training.router)
    routes = [r for router in routers for r in router.routes if isinstance(r, APIRoute)]
    writing = {(m, r.path) for r in routes for m in r.methods if m not in {"GET", "HEAD"}}
    assert writing == {("POST", "/ui/login"), ("POST", "/ui/logout")}  # the cookie, not the store
