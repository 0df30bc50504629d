"""The session page's defects, fixed: DAG labels that fit their boxes, an imported session's sub-goals,
timeline bars as long as their labels say, feedback (late included) on the timeline, token counts from
the server's usage, and a reply the action parser refused marked as failed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sessions_support import SEED_ID, T0, fill
from ui_support import READER, TOKENS

from sessionrl.service import parse_tokens
from sessionrl.session.model import (
    CallStatus,
    Feedback,
    FeedbackType,
    LLMCall,
    Plan,
    Session,
    SessionState,
    SubGoal,
    ToolCall,
)
from sessionrl.store import SessionStore
from sessionrl.ui import UIConfig, create_ui_app, views


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, SessionStore]]:
    root = tmp_path_factory.mktemp("page")
    fill(root / "s.db", root / "runs")
    app = create_ui_app(f"sqlite:///{root / 's.db'}", UIConfig(runs_dir=root / "runs"), parse_tokens(TOKENS))
    with TestClient(app, headers={"Authorization": f"Bearer {READER}"}) as opened:
        yield opened, app.state.store


def test_an_imported_sessions_sub_goals_show_the_llm_call_that_served_them(
    world: tuple[TestClient, SessionStore],
) -> None:
    seed = world[1].get(SEED_ID)
    assert seed.state is SessionState.FINISHED
    nodes = {n.id: n for n in views.layout(seed).nodes}
    assert (nodes["sg1"].status, nodes["sg1"].call_id) == ("success", "call_def456")
    assert (nodes["sg2"].status, nodes["sg2"].call_id) == ("not recorded", None)  # the record lacks it
    page = world[0].get(f"/ui/sessions/{SEED_ID}").text
    assert 'data-status="pending"' not in page


def test_a_sub_goal_no_call_served_is_pending_while_running_and_not_run_once_ended() -> None:
    plan = Plan(root_goal="g", subgoals=(SubGoal(id="a", description="x"),))
    running = Session(
        session_id="s", trace_id="0" * 32, user_query="q", plan=plan, state=SessionState.EXECUTING,
        created_at=T0, updated_at=T0,
    )  # fmt: skip
    ended = running.model_copy(update={"state": SessionState.FINISHED})
    assert views.layout(running).nodes[0].status == "pending"
    assert views.layout(ended).nodes[0].status == "not run"


def test_dag_labels_are_cut_to_fit_their_box_and_kept_whole_in_the_tooltip() -> None:
    long = "check_the_customer_order_history_against_the_warehouse"
    plan = Plan(root_goal="g", subgoals=(SubGoal(id="a", description=long * 2, tool=long),))
    session = Session(
        session_id="s", trace_id="0" * 32, user_query="q", plan=plan, created_at=T0, updated_at=T0
    )
    (node,) = views.layout(session).nodes
    room = (views.NODE_W - 16) / views.CHAR_W
    assert len(node.title) <= room
    assert len(node.line) <= room
    assert node.title.endswith("…")
    assert node.label == long * 2


def test_bars_are_as_long_as_their_labels_say_and_late_feedback_is_on_the_timeline() -> None:
    # a call whose reported latency (300 ms) is not its start-to-end time (100 ms)
    tool = ToolCall(
        call_id="t", tool="x", status=CallStatus.SUCCESS, latency_ms=300.0,
        started_at=T0, finished_at=T0 + timedelta(milliseconds=100),
    )  # fmt: skip
    llm = LLMCall(
        call_id="l", latency_ms=100.0, started_at=T0 + timedelta(milliseconds=300),
        finished_at=T0 + timedelta(milliseconds=400),
    )  # fmt: skip
    late = Feedback(
        type=FeedbackType.HUMAN_RATING, score=4, annotator="doc_007",
        occurred_at=T0 + timedelta(hours=2), received_at=T0 + timedelta(hours=2),
    )  # fmt: skip
    soon = Feedback(type=FeedbackType.COMMENT, occurred_at=T0, received_at=T0 + timedelta(milliseconds=200))
    session = Session(
        session_id="s", trace_id="0" * 32, user_query="q", tool_calls=(tool,), llm_calls=(llm,),
        feedback=(late, soon), created_at=T0, updated_at=T0,
    )  # fmt: skip
    line = views.timeline(session)
    assert line.span_ms == 400.0
    bars = {b.anchor: b for b in line.bars}
    assert (bars["t"].left, bars["t"].width, bars["t"].latency_ms) == (0.0, 75.0, 300.0)
    assert (bars["l"].left, bars["l"].width) == (75.0, 25.0)
    ticks = {t.label: t for t in line.feedback}
    assert (ticks["comment"].left, ticks["comment"].after_ms) == (50.0, 0.0)
    rating = ticks["human_rating 4 by doc_007"]
    assert (rating.left, rating.after_ms) == (100.0, 2 * 3600 * 1000 - 400)
    assert views.later(rating.after_ms) == "+1 h 59 min"


def test_token_counts_come_from_the_servers_usage() -> None:
    call = LLMCall(call_id="c", tokens_used=0, usage={"prompt_tokens": 40, "completion_tokens": 12})
    assert views.tokens(call) == "52 tokens (prompt 40, completion 12)"
    total = LLMCall(call_id="c", usage={"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 60})
    assert views.tokens(total) == "60 tokens (prompt 40, completion 12)"
    assert views.tokens(LLMCall(call_id="c", tokens_used=7)) == "7 tokens"


def test_a_reply_the_parser_refused_carries_a_failure_badge(world: tuple[TestClient, SessionStore]) -> None:
    page = world[0].get("/ui/sessions/judged-1").text
    assert (
        '<span class="badge status-error" title="judged failed by a verdict on this call">UNPARSEABLE_ACTION'
        in page
    )
    assert '<span class="badge status-success">success</span>' in page  # its tool call went through
    assert page.count("status-success") >= 1
    bars = {b.anchor: b for b in views.timeline(world[1].get("judged-1")).bars}
    assert bars["judged-1-l"].status == "error"
    assert bars["judged-1-l"].marks == ("judged: UNPARSEABLE_ACTION",)


def test_the_rewards_section_gives_each_versions_values(world: tuple[TestClient, SessionStore]) -> None:
    page = world[0].get("/ui/sessions/failed-1").text
    assert "session reward -0.500 · long-term -0.200 · rules r1" in page
    assert "session reward +0.100 · long-term +0.000 · rules r2" in page
    assert "task failed" in page
