"""The dashboard in a real headless Chromium: log in, filter sessions, read an orders-expert session's DAG
and timeline, follow a reward term to its step, read a run, find nothing that writes with a read token,
and render `/docs` with the network cut off. Each test saves screenshots under its temporary folder."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from playwright.sync_api import expect
from ui_support import READER, WRITER, World, log_in

from sessionrl.session.model import SessionCreate, SessionState
from sessionrl.store import SessionQuery, SessionStore


def found(page: Any) -> int:
    return int(page.text_content("#found"))


def test_log_in_and_filter_the_session_list(page: Any, dashboard: str, world: World, tmp_path: Path) -> None:
    log_in(page, dashboard, READER)
    with SessionStore.open(f"sqlite:///{world.db}") as store:
        total = store.count(SessionQuery())
        finished = store.count(SessionQuery(state=SessionState.FINISHED))
        chinese = "SELECT comment FROM feedback WHERE comment GLOB '*[一-龥]*' LIMIT 1"
        (comment,) = store.sql(chinese)[0].values()
        word = next(w for w in comment.split() if any("\u4e00" <= ch <= "\u9fa5" for ch in w))[:3]
        commented = store.count(SessionQuery(comment_contains=word))
    assert found(page) == total
    page.wait_for_function(f"document.querySelector('[data-count=total]').textContent === '{total}'")
    page.screenshot(path=tmp_path / "sessions.png", full_page=True)

    page.select_option("select[name=state]", "finished")
    page.click("form.filters button[type=submit]")
    expect(page.locator("#found")).to_have_text(str(finished))
    assert finished < total
    assert "state=finished" in page.url  # the filter is in the address, so the view can be shared
    states = {c.strip() for c in page.locator("table.sessions tbody td:nth-child(2)").all_text_contents()}
    assert {s.split(" · ")[0] for s in states} == {"finished"}  # with the task verdict where there is one

    page.select_option("select[name=state]", "")
    page.fill("input[name=comment]", word)
    page.click("form.filters button[type=submit]")
    expect(page.locator("#found")).to_have_text(str(commented))
    assert 0 < commented < total
    page.screenshot(path=tmp_path / "sessions-comment.png", full_page=True)

    # a filter that does not parse is named on the page (and logs no error)
    page.fill("input[name=comment]", "")
    page.fill("input[name=tool_share]", "nonsense")
    page.click("form.filters button[type=submit]")
    expect(page.locator("#results .problem")).to_contain_text("expected TOOL<SHARE")
    page.fill("input[name=tool_share]", "")

    # the counts are live: a session opened elsewhere shows up without reloading the page
    with SessionStore.open(f"sqlite:///{world.db}") as store:
        store.create(SessionCreate(user_query="a new one", session_id="ui-live-count"))
    expect(page.locator("[data-count=total]")).to_have_text(str(total + 1), timeout=15_000)
    expect(page.locator("[data-count=created]")).not_to_have_text("0")


def test_an_expert_session_shows_its_plan_and_every_step(
    page: Any, dashboard: str, world: World, tmp_path: Path
) -> None:
    log_in(page, dashboard, READER)
    session_id = world.expert_ids[-1]
    with SessionStore.open(f"sqlite:///{world.db}") as store:
        session = store.get(session_id)
    assert session.plan is not None
    assert session.tool_calls
    page.goto(f"{dashboard}/ui/sessions/{session_id}")
    nodes = page.locator("svg.dag [data-subgoal]")
    assert sorted(nodes.evaluate_all("els => els.map(e => e.dataset.subgoal)")) == sorted(
        g.id for g in session.plan.subgoals
    )
    served = page.locator("svg.dag .node.status-success")
    assert served.count() == len({c.subgoal_id for c in session.tool_calls if c.status == "success"})
    steps = page.locator(".gantt [data-step]").evaluate_all("els => els.map(e => e.dataset.step)")
    assert sorted(steps) == sorted(["plan", *session.call_ids()])
    for call_id in session.call_ids():
        assert page.locator(f"#step-{call_id}").count() == 1
    page.screenshot(path=tmp_path / "session.png", full_page=True)


def test_a_reward_term_links_to_the_step_it_was_charged_to(
    page: Any, dashboard: str, world: World, tmp_path: Path
) -> None:
    log_in(page, dashboard, READER)
    page.goto(f"{dashboard}/ui/sessions/{world.scored}")
    page.click("ul.rewards a >> text=version 1")
    page.wait_for_url(f"**/ui/sessions/{world.scored}/rewards/1")
    assert page.locator("table.terms tbody tr").count() > 0
    page.screenshot(path=tmp_path / "reward.png", full_page=True)
    link = page.locator("a.step-link").first
    call_id = link.get_attribute("href").rsplit("#step-", 1)[1]
    link.click()
    page.wait_for_url(f"**/ui/sessions/{world.scored}#step-{call_id}")
    target = page.locator(f"#step-{call_id}")
    assert target.evaluate("e => e.matches(':target')")
    assert target.is_visible()
    page.screenshot(path=tmp_path / "reward-step.png")


def test_a_read_token_reaches_nothing_that_writes(page: Any, service: str, tmp_path: Path) -> None:
    log_in(page, service, READER)
    page.screenshot(path=tmp_path / "service-sessions.png")
    forms = page.locator("form").evaluate_all("fs => fs.map(f => [f.method, new URL(f.action).pathname])")
    assert all(method == "get" or path == "/ui/logout" for method, path in forms), forms
    writes = [
        (method.upper(), re.sub(r"\{[^}]+\}", "s_none", path))
        for path, operations in page.request.get(f"{service}/openapi.json").json()["paths"].items()
        for method in operations
        if method != "get"
    ]
    assert ("POST", "/v1/sessions") in writes
    for method, path in writes:
        # the login cookie is for the pages alone: the API wants a bearer token, and a read one is refused
        with_cookie = page.request.fetch(f"{service}{path}", method=method, data={})
        assert with_cookie.status == 401, (method, path)
        as_reader = page.request.fetch(f"{service}{path}", method=method, data={}, headers=bearer(READER))
        assert as_reader.status == 403, (method, path)
    created = page.request.post(f"{service}/v1/sessions", data={"user_query": "hi"}, headers=bearer(WRITER))
    assert created.status == 201


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_docs_render_with_the_network_cut_off(context: Any, page: Any, service: str, tmp_path: Path) -> None:
    outside: list[str] = []

    def loopback_only(route: Any) -> None:
        if route.request.url.startswith(service):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", loopback_only)
    page.goto(f"{service}/docs")
    page.wait_for_selector(".swagger-ui .info .title")
    assert "sessionrl" in page.text_content(".swagger-ui .info .title")
    assert page.locator(".swagger-ui .opblock").count() > 5
    page.screenshot(path=tmp_path / "docs.png")
    assert outside == []
