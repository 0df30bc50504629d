"""The engine end to end on the real store and executor: plans, tools, LLM steps, finish, replays."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from orchestrator_support import MakeContract, MakeEngine

from sessionrl.errors import InvalidTransition, NotFound, StaleState
from sessionrl.orchestrator.config import LaneConfig, OrchestratorConfig
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.guards import PlanRejection, Refusal
from sessionrl.orchestrator.policy import PolicyReply, ScriptedBackend
from sessionrl.orchestrator.results import PlanPayload, StepError, StepKind
from sessionrl.session import (
    Anchor,
    CallStatus,
    Claim,
    Feedback,
    FeedbackType,
    FinalOutput,
    Plan,
    SessionCreate,
    SessionState,
    SubGoal,
)
from sessionrl.skills import Skill, callable_skill
from sessionrl.store import SessionStore

PLAN = {
    "root_goal": "refund the order",
    "subgoals": [
        {"id": "a", "description": "find the order", "tool": "find"},
        {"id": "b", "description": "refund it", "tool": "refund", "depends_on": ["a"]},
    ],
}


class Counting:
    """A skill function that counts its calls and answers with the call number."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, params: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return {"n": self.calls, **params}


@pytest.fixture
def find() -> Counting:
    return Counting()


@pytest.fixture
def skills(make_contract: MakeContract, find: Counting) -> list[Skill]:
    return [
        callable_skill(make_contract("find"), find),
        callable_skill(make_contract("refund"), lambda p: {"refunded": True}),
        callable_skill(make_contract("notify"), lambda p: {"sent": True}),
    ]


async def planned(engine: Orchestrator, plan: dict[str, Any] = PLAN) -> str:
    sid = await engine.init_session("refund my order")
    result = await engine.execute_step(sid, "plan", {"plan": plan})
    assert result.ok, result
    return sid


async def test_a_policy_plan_is_recorded_with_its_tokens_and_starts_execution(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    reply = PolicyReply(
        text=json.dumps(PLAN), token_ids=(1, 2, 3), logprobs=(-0.5, -0.1, -0.2), policy_version=7
    )
    backend = ScriptedBackend([reply])
    engine = make_engine(skills, [backend])
    sid = await engine.init_session(SessionCreate(user_query="refund my order", scenario="shop"))
    result = await engine.execute_step(sid, StepKind.PLAN)
    assert result.ok
    assert result.state is SessionState.EXECUTING
    assert result.plan is not None
    assert [g.id for g in result.plan.subgoals] == ["a", "b"]
    session = await engine.session(sid)
    (call,) = session.llm_calls
    assert call.call_id == result.call_id
    assert (call.purpose, call.token_ids, call.logprobs, call.policy_version) == (
        "plan",
        (1, 2, 3),
        (-0.5, -0.1, -0.2),
        7,
    )
    # the planning prompt lists the skills and ends with the user's query
    messages, purpose = backend.calls[0]
    assert purpose == "plan"
    assert "- find: The find skill." in messages[0].content
    assert messages[-1].content == "refund my order"
    assert session.state_version == result.state_version == 4  # created, llm call, plan, executing


async def test_an_unreadable_plan_is_a_failed_step_that_keeps_the_text(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    engine = make_engine(skills, [ScriptedBackend(["I would rather not plan."])])
    sid = await engine.init_session("refund my order")
    result = await engine.execute_step(sid, "plan")
    assert not result.ok
    assert result.error_code == StepError.UNPARSEABLE_PLAN
    assert result.text == "I would rather not plan."
    session = await engine.session(sid)
    assert session.plan is None
    assert session.state is SessionState.CREATED
    assert [c.response for c in session.llm_calls] == ["I would rather not plan."]


async def test_a_broken_plan_rejects_the_session_with_a_reasoned_feedback(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    cyclic = {
        "root_goal": "r",
        "subgoals": [
            {"id": "a", "description": "x", "tool": "find", "depends_on": ["b"]},
            {"id": "b", "description": "y", "tool": "refund", "depends_on": ["a"]},
        ],
    }
    engine = make_engine(skills, [ScriptedBackend([json.dumps(cyclic)])])
    sid = await engine.init_session("q")
    result = await engine.execute_step(sid, "plan")
    assert not result.ok
    assert result.rejection is PlanRejection.CYCLE
    assert result.error_code == StepError.PLAN_REJECTED
    assert result.state is SessionState.REJECTED
    session = await engine.session(sid)
    (feedback,) = session.feedback
    assert feedback.type is FeedbackType.PLAN_REJECTION
    assert feedback.data == {"reason": "cycle", "detail": "dependency cycle a -> b -> a"}
    assert feedback.anchor.call_id == result.call_id  # anchored to the policy call that planned
    with pytest.raises(InvalidTransition):
        await engine.execute_step(sid, "tool", {"tool": "find"})


async def test_a_forbidden_tool_in_an_expert_plan_is_rejected(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    engine = make_engine(skills, config=OrchestratorConfig(forbidden_tools=frozenset({"refund"})))
    sid = await engine.init_session("q")
    result = await engine.execute_step(sid, "plan", {"plan": PLAN})
    assert result.rejection is PlanRejection.FORBIDDEN_TOOL
    session = await engine.session(sid)
    assert session.feedback[0].anchor == Anchor()  # no policy call: the whole session
    assert session.state is SessionState.REJECTED


async def test_a_session_is_planned_once(make_engine: MakeEngine, skills: list[Skill]) -> None:
    engine = make_engine(skills)
    sid = await planned(engine)
    with pytest.raises(InvalidTransition, match="already has a plan"):
        await engine.execute_step(sid, "plan", {"plan": PLAN})


async def test_a_step_with_unmet_dependencies_is_recorded_as_refused_and_not_run(
    make_engine: MakeEngine, make_contract: MakeContract, find: Counting
) -> None:
    refunds = Counting()
    engine = make_engine(
        [callable_skill(make_contract("find"), find), callable_skill(make_contract("refund"), refunds)]
    )
    sid = await planned(engine)
    refused = await engine.execute_step(sid, "tool", {"tool": "refund", "subgoal_id": "b"})
    assert not refused.ok
    assert refused.refused is Refusal.UNMET_DEPENDENCIES
    assert refused.status is CallStatus.REFUSED
    assert refunds.calls == 0
    found = await engine.execute_step(sid, "tool", {"tool": "find", "subgoal_id": "a", "params": {"id": 7}})
    assert found.ok
    assert found.output == {"n": 1, "id": 7}
    done = await engine.execute_step(sid, "tool", {"tool": "refund", "subgoal_id": "b"})
    assert done.ok
    assert refunds.calls == 1
    session = await engine.session(sid)
    assert [c.status for c in session.tool_calls] == [
        CallStatus.REFUSED,
        CallStatus.SUCCESS,
        CallStatus.SUCCESS,
    ]


async def test_the_policy_can_choose_the_tool(
    make_engine: MakeEngine, skills: list[Skill], find: Counting
) -> None:
    choice = 'Calling: {"tool": "find", "params": {"id": 3}, "subgoal_id": "a"}'
    backend = ScriptedBackend([choice, "no idea"])
    engine = make_engine(skills, [backend])
    sid = await planned(engine)
    result = await engine.execute_step(sid, "tool", {})
    assert result.ok
    assert (result.tool, result.output, result.text) == ("find", {"n": 1, "id": 3}, choice)
    session = await engine.session(sid)
    assert session.tool_calls[0].subgoal_id == "a"
    assert session.llm_calls[0].call_id == result.policy_call_id
    # the acting prompt shows the tools as OpenAI schemas and the plan
    messages, purpose = backend.calls[0]
    assert purpose == "act"
    assert '"name":"find"' in messages[0].content
    assert "refund the order" in messages[2].content
    unreadable = await engine.execute_step(sid, "tool", {})
    assert unreadable.error_code == StepError.UNPARSEABLE_TOOL_CALL
    assert unreadable.text == "no idea"
    assert find.calls == 1


async def test_an_llm_step_records_the_call_and_a_failing_backend_records_nothing(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    engine = make_engine(skills, [ScriptedBackend(["Hello!"])])
    sid = await engine.init_session("hi")
    result = await engine.execute_step(sid, "llm", {"purpose": "greet"})
    assert result.ok
    assert result.text == "Hello!"
    failed = await engine.execute_step(sid, "llm")
    assert not failed.ok
    assert failed.error_code == StepError.POLICY_ERROR
    assert failed.retryable
    session = await engine.session(sid)
    assert [(c.purpose, c.response) for c in session.llm_calls] == [("greet", "Hello!")]
    assert failed.state_version == session.state_version


async def test_a_session_always_goes_to_the_same_backend(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    backends = [ScriptedBackend(["x"] * 20) for _ in range(3)]
    engine = make_engine(skills, backends)
    sids = [
        await engine.init_session(SessionCreate(user_query=f"q{i}", session_id=f"s{i}")) for i in range(8)
    ]
    for sid in sids * 2:
        await engine.execute_step(sid, "llm")
    for i, sid in enumerate(sids):
        asked = [b for b in backends if any(m[-1].content == f"q{i}" for m, _ in b.calls)]
        assert asked == [engine.route(sid)]
    assert sum(len(b.calls) > 0 for b in backends) > 1  # the eight sessions do not all land on one


async def test_finish_penalises_unverified_sub_goals_and_flags_missing_citations(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    engine = make_engine(skills, config=OrchestratorConfig(hallucination_penalty=-3.5))
    sid = await planned(engine)
    found = await engine.execute_step(sid, "tool", {"tool": "find", "subgoal_id": "a"})
    output = FinalOutput(
        text="Refunded.", claims=(Claim(text="refunded", call_ids=(str(found.call_id), "c_ghost")),)
    )
    result = await engine.finish(sid, output)
    assert result.state is SessionState.FINISHED
    assert result.unverified_subgoals == ("b",)
    assert result.missing_citations == ("c_ghost",)
    session = await engine.session(sid)
    penalty, flag = session.feedback
    assert (penalty.type, penalty.score, penalty.anchor.subgoal_id) == (
        FeedbackType.HALLUCINATION_PENALTY,
        -3.5,
        "b",
    )
    assert flag.type is FeedbackType.PROVENANCE_FLAG
    assert flag.data == {"missing_call_ids": ["c_ghost"]}
    assert session.final_output == output
    with pytest.raises(InvalidTransition):
        await engine.finish(sid, "again")


async def test_a_fully_executed_plan_finishes_clean(make_engine: MakeEngine, skills: list[Skill]) -> None:
    engine = make_engine(skills)
    sid = await planned(engine)
    await engine.execute_step(sid, "tool", {"tool": "find", "subgoal_id": "a"})
    await engine.execute_step(sid, "tool", {"tool": "refund", "subgoal_id": "b"})
    result = await engine.finish(sid, "Refunded.")
    assert (result.unverified_subgoals, result.missing_citations) == ((), ())
    assert (await engine.session(sid)).feedback == ()


async def test_feedback_is_accepted_after_finish_and_the_later_one_wins(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    engine = make_engine(skills)
    sid = await engine.init_session("q")
    await engine.finish(sid, "done")
    late = Feedback(type=FeedbackType.HUMAN_RATING, score=5.0)
    older = Feedback(
        type=FeedbackType.HUMAN_RATING, score=1.0, occurred_at=late.occurred_at.replace(year=2020)
    )
    first = await engine.inject_feedback(sid, late)
    second = await engine.inject_feedback(sid, older)
    assert first.in_force
    assert not second.in_force
    assert [f.score for f in (await engine.session(sid)).feedback] == [5.0]


async def test_only_active_sessions_stay_in_the_cache(make_engine: MakeEngine, skills: list[Skill]) -> None:
    engine = make_engine(skills)
    done, active = await engine.init_session("q"), await engine.init_session("q")
    await engine.execute_step(active, "tool", {"tool": "find"})
    assert (len(engine.cache), engine.cache.misses) == (2, 0)
    await engine.finish(done, "done")
    assert engine.cache.get(done) is None  # ended: it left the cache
    assert engine.cache.get(active) is not None
    misses = engine.cache.misses
    late = await engine.inject_feedback(done, Feedback(type=FeedbackType.HUMAN_RATING, score=4.0))
    assert late.state is SessionState.FINISHED
    assert engine.cache.misses == misses + 1  # the late feedback read the store
    assert engine.cache.get(done) is None  # and did not bring the ended session back
    assert (await engine.session(done)).feedback[0].score == 4.0


async def test_unknown_sessions_and_taken_ids_are_errors(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    engine = make_engine(skills)
    with pytest.raises(NotFound):
        await engine.execute_step("s_nope", "tool", {"tool": "find"})
    await engine.init_session(SessionCreate(user_query="q", session_id="mine"))
    with pytest.raises(InvalidTransition):
        await engine.init_session(SessionCreate(user_query="q", session_id="mine"))


async def test_expected_version_guards_a_step(make_engine: MakeEngine, skills: list[Skill]) -> None:
    engine = make_engine(skills)
    sid = await engine.init_session("q")
    with pytest.raises(StaleState):
        await engine.execute_step(sid, "tool", {"tool": "find"}, expected_version=5)
    result = await engine.execute_step(sid, "tool", {"tool": "find"}, expected_version=1)
    assert result.ok


async def test_a_replayed_key_returns_the_first_result_and_runs_nothing(
    make_engine: MakeEngine, skills: list[Skill], find: Counting, store: SessionStore
) -> None:
    engine = make_engine(skills)
    sid = await planned(engine)
    first = await engine.execute_step(sid, "tool", {"tool": "find", "subgoal_id": "a"}, key="k1")
    await engine.execute_step(sid, "tool", {"tool": "notify"})
    again = await engine.execute_step(sid, "tool", {"tool": "find", "subgoal_id": "a"}, key="k1")
    assert again == first  # same call, output and state_version, although the session moved on
    assert find.calls == 1
    # a fresh engine on the same store (a restart) answers from the log as well
    restarted = make_engine(skills)
    assert await restarted.execute_step(sid, "tool", {"tool": "find", "subgoal_id": "a"}, key="k1") == first
    assert find.calls == 1
    finish = await engine.finish(sid, "done", key="f1")
    assert await restarted.finish(sid, "done", key="f1") == finish
    events = len(store.events(sid))
    feedback = Feedback(type=FeedbackType.COMMENT, comment="thanks")
    assert await engine.inject_feedback(sid, feedback, key="fb") == await engine.inject_feedback(
        sid, feedback, key="fb"
    )
    assert len(store.events(sid)) == events + 1


async def test_concurrent_requests_with_one_key_run_once(
    make_engine: MakeEngine, skills: list[Skill], find: Counting
) -> None:
    engine = make_engine(skills)
    sid = await engine.init_session("q")
    results = await asyncio.gather(
        *(engine.execute_step(sid, "tool", {"tool": "find"}, key="same") for _ in range(5))
    )
    assert find.calls == 1
    assert all(r == results[0] for r in results)


async def test_a_replayed_create_returns_the_same_session(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    engine = make_engine(skills)
    first = await engine.init_session("q", key="create-1")
    assert await make_engine(skills).init_session("q", key="create-1") == first
    named = SessionCreate(user_query="q", session_id="named")
    assert await engine.init_session(named, key="create-2") == "named"
    assert await engine.init_session(named, key="create-2") == "named"


async def test_concurrent_tool_steps_on_one_session_are_all_recorded(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    engine = make_engine(skills)
    sid = await engine.init_session("q")  # still `created`: each first step also wants `executing`
    results = await asyncio.gather(*(engine.execute_step(sid, "tool", {"tool": "notify"}) for _ in range(10)))
    assert all(r.ok for r in results)
    session = await engine.session(sid)
    assert len(session.tool_calls) == 10
    assert session.state is SessionState.EXECUTING
    assert sorted(r.state_version for r in results) == sorted({r.state_version for r in results})


async def test_concurrent_first_steps_wait_for_the_one_entering_executing(
    make_engine: MakeEngine, skills: list[Skill]
) -> None:
    engine = make_engine(skills)
    sid = await engine.init_session("q")
    await asyncio.gather(*(engine.execute_step(sid, "tool", {"tool": "notify"}) for _ in range(10)))
    # handed to the store: 1 created + 1 state change + 10 tool calls; a step that lost a race to the
    # state change would add its own rejected pair and a retried call
    assert engine.committer.events == 1 + 1 + 10
    assert (await engine.session(sid)).state_version == 12


async def test_a_cancelled_waiter_leaves_the_chained_unit_and_the_other_waiters_alone(
    make_engine: MakeEngine, skills: list[Skill], store: SessionStore
) -> None:
    engine = make_engine(skills)
    sid = await engine.init_session("q")
    release = threading.Event()
    append_units = store.append_units

    def held(units: Any, own: Any) -> Any:
        release.wait(10)
        return append_units(units, own)

    store.append_units = held  # type: ignore[method-assign]
    first = asyncio.create_task(engine.execute_step(sid, "tool", {"tool": "notify"}))
    while sid not in engine.writer.chained:  # the first step's unit (executing + its call) is being committed
        await asyncio.sleep(0)
    waiting = [asyncio.create_task(engine.execute_step(sid, "tool", {"tool": "notify"})) for _ in range(2)]
    while len(engine.writer.chained[sid]) < 2:
        await asyncio.sleep(0)
    waiting[0].cancel()
    release.set()
    assert (await first).ok
    assert (await waiting[1]).ok
    with pytest.raises(asyncio.CancelledError):
        await waiting[0]
    # 1 created + the first step's 2 + the waiter that stayed; the cancelled one wrote nothing
    assert engine.committer.events == 1 + 2 + 1


async def test_a_slow_tool_lane_does_not_hold_up_llm_steps(
    make_engine: MakeEngine, make_contract: MakeContract
) -> None:
    gate = asyncio.Event()

    async def stuck(params: dict[str, Any]) -> dict[str, Any]:
        await gate.wait()
        return {}

    config = OrchestratorConfig(tool_lane=LaneConfig(concurrency=1))
    contract = make_contract("stuck", sla={"timeout_s": 3600})
    engine = make_engine([callable_skill(contract, stuck)], [ScriptedBackend(["fine"])], config)
    sid = await engine.init_session("q")
    tools = [asyncio.create_task(engine.execute_step(sid, "tool", {"tool": "stuck"})) for _ in range(2)]
    await asyncio.sleep(0.01)
    assert engine.lanes[StepKind.TOOL].running == 1  # one tool runs, one waits for the lane
    llm = await asyncio.wait_for(engine.execute_step(sid, "llm"), timeout=5)
    assert llm.ok
    assert not any(t.done() for t in tools)
    gate.set()
    assert all(r.ok for r in await asyncio.gather(*tools))


async def test_a_plan_payload_may_be_a_model(make_engine: MakeEngine, skills: list[Skill]) -> None:
    engine = make_engine(skills)
    sid = await engine.init_session("q")
    plan = Plan(root_goal="r", subgoals=(SubGoal(id="x", description="notify", tool="notify"),))
    result = await engine.execute_step(sid, StepKind.PLAN, PlanPayload(plan=plan))
    assert result.plan == plan
