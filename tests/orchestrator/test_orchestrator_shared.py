"""Two engines on one store, as two `sessionrl serve` processes on one database: a request may go to
either, and each sees what the other wrote before it answers."""

from __future__ import annotations

import pytest
from orchestrator_support import MakeContract, MakeEngine

from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.session import CallStatus, FeedbackType, SessionState
from sessionrl.skills import Skill, callable_skill
from sessionrl.store import SessionStore

PLAN = {
    "root_goal": "refund the order",
    "subgoals": [
        {"id": "a", "description": "find the order", "tool": "find"},
        {"id": "b", "description": "refund it", "tool": "refund", "depends_on": ["a"]},
    ],
}


@pytest.fixture
def skills(make_contract: MakeContract) -> list[Skill]:
    return [
        callable_skill(make_contract("find"), lambda p: {"found": True}),
        callable_skill(make_contract("refund"), lambda p: {"refunded": True}),
    ]


async def planned_on(first: Orchestrator, second: Orchestrator) -> str:
    """A planned session that both engines have cached (at version 3: created, planned, executing)."""
    sid = await first.init_session("refund my order")
    assert (await first.execute_step(sid, "plan", {"plan": PLAN})).ok
    await second.session(sid)
    assert second.cache.get(sid) is not None
    return sid


async def test_a_step_depending_on_another_engines_step_runs(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    a, b = make_engine(skills), make_engine(skills)
    sid = await planned_on(a, b)
    await a.execute_step(sid, "tool", {"tool": "find", "subgoal_id": "a"})
    stale = b.cache.get(sid)
    assert stale is not None
    assert not stale.tool_calls  # b's view has not seen the call
    result = await b.execute_step(sid, "tool", {"tool": "refund", "subgoal_id": "b"})
    assert result.ok
    assert (result.status, result.refused) == (CallStatus.SUCCESS, None)  # not refused: `a` succeeded


async def test_a_finish_on_a_stale_view_is_rebuilt_on_the_stored_session(
    make_engine: MakeEngine, skills: list[Skill], store: SessionStore
) -> None:
    a, b = make_engine(skills), make_engine(skills)
    sid = await planned_on(a, b)
    await a.execute_step(sid, "tool", {"tool": "find", "subgoal_id": "a"})
    await a.execute_step(sid, "tool", {"tool": "refund", "subgoal_id": "b"})
    done = await b.finish(sid, "refunded")
    assert done.state is SessionState.FINISHED
    session = store.get(sid)
    assert [f.type for f in session.feedback if f.type is FeedbackType.HALLUCINATION_PENALTY] == []
    assert session.final_output is not None
    log = store.events(sid)
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert [e.type for e in log][-2:] == ["output_set", "state_changed"]


async def test_a_version_seen_on_another_engine_is_the_one_expected(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    a, b = make_engine(skills), make_engine(skills)
    sid = await planned_on(a, b)
    seen = await a.execute_step(sid, "tool", {"tool": "find", "subgoal_id": "a"})
    result = await b.execute_step(sid, "tool", {"tool": "refund"}, expected_version=seen.state_version)
    assert result.ok
    assert result.state_version == seen.state_version + 1


async def test_a_single_event_built_on_a_stale_view_is_refused_and_rebuilt(
    make_engine: MakeEngine, skills: list[Skill], store: SessionStore
) -> None:
    a, b = make_engine(skills), make_engine(skills)
    sid = await planned_on(a, b)
    await a.execute_step(sid, "tool", {"tool": "find"})
    before = b.committer.events
    result = await b.execute_step(sid, "tool", {"tool": "refund"})
    assert result.ok
    # the call went to the store twice: refused as built on version 3, then written on version 4
    assert b.committer.events == before + 2
    assert store.get(sid).state_version == 5
    assert (await b.session(sid)).state_version == 5
