"""Scripted plans run through the real orchestrator into the store, judged by a `task_outcome` feedback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest

from sessionrl.envs import ExpertPlan, Faults, Split, Task
from sessionrl.envs.base import stream_seed
from sessionrl.envs.retail import RetailEnv
from sessionrl.envs.runner import (
    EpisodeSkills,
    gold_plan,
    replay_gold,
    run_expert,
    run_many,
    run_session,
    session_plan,
)
from sessionrl.eval.metrics import task_success
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.session.model import CallStatus, FeedbackType, Session, SessionState
from sessionrl.skills import SkillExecutor
from sessionrl.store import SessionStore


@pytest.fixture(scope="module")
def env(retail_data: Path) -> RetailEnv:
    return RetailEnv(retail_data)


@pytest.fixture
def store() -> Iterator[SessionStore]:
    with SessionStore.open("sqlite://") as opened:
        yield opened


@pytest.fixture
async def engine(store: SessionStore) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(store, EpisodeSkills(), config=OrchestratorConfig(max_subgoals=32)) as opened:
        yield opened


def single_use(tasks: Sequence[Task], *, env: RetailEnv) -> list[Task]:
    """Tasks whose expert plan names each tool once: the engine's plan breaker refuses a repeated tool."""
    return [t for t in tasks if len({s.tool for s in env.expert(t).steps}) == len(env.expert(t).steps)]


def verdict(session: Session) -> tuple[float | None, dict[str, bool]]:
    (outcome,) = [f for f in session.feedback if f.type == FeedbackType.TASK_OUTCOME]
    return outcome.score, outcome.data["checks"]


def calls(session: Session) -> list[tuple[str | None, str, dict[str, object]]]:
    return [(c.subgoal_id, c.tool, c.params) for c in session.tool_calls]


def planned(plan: ExpertPlan) -> list[tuple[str | None, str, dict[str, object]]]:
    return [(s.id, s.tool, dict(s.params)) for s in plan.steps]


async def test_expert_sessions_are_solved_stored_and_follow_the_plan(
    env: RetailEnv, engine: Orchestrator, store: SessionStore
) -> None:
    tasks = single_use(env.tasks(Split.TRAIN)[:12], env=env)[:6]
    assert max(len(env.expert(t).steps) for t in tasks) >= 5  # at least one task reads and changes orders
    for i, task in enumerate(tasks):
        plan = env.expert(task)
        session = await run_expert(engine, env, task, seed=i)
        assert session == store.get(session.session_id)
        assert session.state == SessionState.FINISHED
        assert verdict(session) == (1.0, {"state": True, "outputs": True})
        assert task_success(session) is True
        assert session.plan == session_plan(plan)
        assert calls(session) == planned(plan)
        assert all(c.status == CallStatus.SUCCESS for c in session.tool_calls)
        assert session.final_output is not None
        assert session.final_output.text == plan.final_message
        assert not [f for f in session.feedback if f.type == FeedbackType.HALLUCINATION_PENALTY]
        assert session.metadata == {
            "env": "retail",
            "split": "train",
            "task_id": task.task_id,
            "agent": "expert",
            "seed": i,
        }
        assert session.user_query == task.instruction


async def test_a_plan_that_changes_nothing_is_judged_a_failure(env: RetailEnv, engine: Orchestrator) -> None:
    task = next(t for t in env.tasks(Split.TRAIN) if env.gold_hash(t) != env.episode(t).state_hash())
    idle = ExpertPlan(goal="do nothing", steps=(), final_message="All done.")
    session = await run_session(engine, env, task, idle, agent="expert", seed=0)
    assert session.state == SessionState.FINISHED
    score, checks = verdict(session)
    assert score == 0.0
    assert checks["state"] is False
    assert task_success(session) is False


async def test_tool_faults_fail_the_first_call_and_refuse_its_dependants(
    env: RetailEnv, engine: Orchestrator
) -> None:
    task = single_use(env.tasks(Split.TRAIN)[:5], env=env)[0]
    session = await run_expert(engine, env, task, seed=0, faults=Faults(tool_error=1.0))
    first, *rest = session.tool_calls
    assert (first.status, first.error_code, first.retryable, first.attempt) == (
        CallStatus.ERROR,
        "UNAVAILABLE",
        True,
        3,  # the executor's default max_attempts: every retry fails too
    )
    assert rest
    assert {(c.status, c.error_code) for c in rest} == {(CallStatus.REFUSED, "UNMET_DEPENDENCIES")}
    penalised = {
        f.anchor.subgoal_id for f in session.feedback if f.type == FeedbackType.HALLUCINATION_PENALTY
    }
    assert penalised == {c.subgoal_id for c in rest}  # a call that ran and failed still executed its sub-goal
    assert verdict(session)[0] == 0.0


async def test_a_reordered_plan_arrives_reversed(env: RetailEnv, engine: Orchestrator) -> None:
    task = single_use(env.tasks(Split.TRAIN)[:5], env=env)[0]
    plan = env.expert(task)
    session = await run_expert(engine, env, task, seed=0, faults=Faults(plan_order=1.0))
    assert session.plan is not None
    assert [g.id for g in session.plan.subgoals] == list(reversed(plan.step_ids))
    assert session.tool_calls[0].status == CallStatus.REFUSED  # the last step waits for the earlier ones
    assert verdict(session)[0] == 0.0


async def test_concurrent_episodes_of_one_task_keep_their_own_state(
    env: RetailEnv, engine: Orchestrator
) -> None:
    # each run cancels or changes the same orders: on shared state the second run's calls would fail
    task = single_use(env.tasks(Split.TRAIN)[:12], env=env)[0]
    assert env.gold_hash(task) != env.episode(task).state_hash()
    sessions = await asyncio.gather(*(run_expert(engine, env, task, seed=s) for s in range(4)))
    assert [verdict(s)[0] for s in sessions] == [1.0] * 4
    assert len({s.session_id for s in sessions}) == 4


async def test_gold_replay_runs_the_gold_actions(env: RetailEnv, engine: Orchestrator) -> None:
    tasks = [
        t
        for t in env.tasks(Split.TEST)
        if len({a["name"] for a in t.payload["actions"]}) == len(t.payload["actions"])
    ]
    for task in tasks[:3]:
        session = await replay_gold(engine, env, task, seed=0)
        actions = [(a["name"], a["kwargs"]) for a in task.payload["actions"]]
        assert [(c.tool, c.params) for c in session.tool_calls] == actions
        assert session.metadata["agent"] == "gold"
        assert verdict(session)[0] == 1.0


def test_gold_plan_steps_depend_on_nothing_and_need_gold_actions(env: RetailEnv) -> None:
    task = next(t for t in env.tasks(Split.TEST) if len(t.payload["actions"]) > 1)
    plan = gold_plan(task)
    assert [s.tool for s in plan.steps] == [a["name"] for a in task.payload["actions"]]
    assert all(s.depends_on == () for s in plan.steps)
    assert plan.final_message == " ".join(task.payload["outputs"])
    with pytest.raises(ValueError, match="has no gold actions"):
        gold_plan(Task(task_id="t-1", split=Split.TRAIN, instruction="hi"))


async def test_expected_entities_reach_the_metadata(env: RetailEnv, engine: Orchestrator) -> None:
    class NamingRetail(RetailEnv):
        def expected_entities(self, task: Task) -> Sequence[str]:
            return [task.payload["user_id"]]

    task = env.tasks(Split.TRAIN)[0]
    session = await run_expert(engine, NamingRetail(env.data), task, seed=0)
    assert session.metadata["expected_entities"] == [task.payload["user_id"]]


async def test_the_engine_must_route_skills_per_episode(env: RetailEnv, store: SessionStore) -> None:
    task = env.tasks(Split.TRAIN)[0]
    async with Orchestrator(store, SkillExecutor(env.episode(task).skills())) as plain:
        with pytest.raises(TypeError, match="EpisodeSkills"):
            await run_expert(plain, env, task, seed=0)
    with pytest.raises(RuntimeError, match="no episode is bound"):
        _ = EpisodeSkills().contracts


def test_run_many_runs_the_first_tasks_into_the_store(env: RetailEnv, store: SessionStore) -> None:
    summary = run_many(env, Split.TRAIN, 3, store=store, concurrency=2, seed=7, progress=False)
    assert (summary.env, summary.split, summary.agent, summary.n) == ("retail", Split.TRAIN, "expert", 3)
    stored = list(store.iter_sessions())
    by_task = {s.metadata["task_id"]: s for s in stored}
    assert sorted(by_task) == sorted(t.task_id for t in env.tasks(Split.TRAIN)[:3])
    assert summary.successes == sum(task_success(s) is True for s in stored)
    assert set(summary.failed) == {t for t, s in by_task.items() if task_success(s) is not True}
    assert all(s.metadata["seed"] == stream_seed(7, t) for t, s in by_task.items())
    assert summary.success_rate == summary.successes / 3
    assert summary.as_dict()["success_rate"] == summary.success_rate
    assert summary.successes == 3  # the first three train tasks name each tool once
