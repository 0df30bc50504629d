"""Scripted plans (the expert, gold replay) run through the real orchestrator into the store, judged by a
`task_outcome` verdict, on the τ-bench retail domain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest

from sessionrl.envs import ExpertPlan, Faults, Split, Task
from sessionrl.envs.base import stream_seed
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.envs.retail import RetailEnv
from sessionrl.episodes import (
    EpisodeSkills,
    EpisodeSpec,
    NoGoldPlans,
    Ran,
    RolloutConfig,
    ScriptedAgent,
    entities_named,
    expert,
    gold,
    guards_for_plans,
    run_episode,
    run_episodes,
    run_many,
    session_plan,
)
from sessionrl.episodes.verdict import task_success
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.session.model import CallStatus, FeedbackType, Session, SessionState
from sessionrl.skills import SkillExecutor
from sessionrl.store import SessionStore

NO_RETRIES = RolloutConfig(expert_retries=0)


@pytest.fixture(scope="module")
def env(retail_data: Path) -> RetailEnv:
    return RetailEnv(retail_data)


@pytest.fixture
def store() -> Iterator[SessionStore]:
    with SessionStore.open("sqlite://") as opened:
        yield opened


@pytest.fixture
async def engine(store: SessionStore) -> AsyncIterator[Orchestrator]:
    config = OrchestratorConfig(max_subgoals=32, repeated_tools=True)
    async with Orchestrator(store, EpisodeSkills(), config=config) as opened:
        yield opened


def single_use(tasks: Sequence[Task], *, env: RetailEnv) -> list[Task]:
    """Tasks whose expert plan names each tool once (each step's failure is then easy to point at)."""
    return [t for t in tasks if len({s.tool for s in env.expert(t).steps}) == len(env.expert(t).steps)]


def repeating(tasks: Sequence[Task], *, env: RetailEnv) -> list[Task]:
    """Tasks whose expert plan calls some tool twice (reads two orders, say)."""
    return [t for t in tasks if len({s.tool for s in env.expert(t).steps}) < len(env.expert(t).steps)]


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
    tasks = env.tasks(Split.TRAIN)[:6]
    assert repeating(tasks, env=env)  # the guards were widened for plans that repeat a tool
    for i, task in enumerate(tasks):
        plan = env.expert(task)
        session = await run_episode(engine, env, EpisodeSpec(task, seed=i), expert(env), RolloutConfig())
        assert session == store.get(session.session_id)
        assert session.state == SessionState.FINISHED
        assert verdict(session) == (1.0, {"state": True, "outputs": True})
        assert Ran.of(session) == Ran(session.session_id, True, None)
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
            "policy_version": None,
            "expected_entities": entities_named(task, plan),
        }
        assert session.tags == ("retail", "train", "expert")
        assert session.user_query == task.instruction


async def test_a_plan_that_changes_nothing_is_judged_a_failure_and_says_why(
    env: RetailEnv, engine: Orchestrator
) -> None:
    task = next(t for t in env.tasks(Split.TRAIN) if env.gold_hash(t) != env.episode(t).state_hash())
    idle = ScriptedAgent("expert", lambda _: ExpertPlan(goal="do nothing", steps=(), final_message="Done."))
    session = await run_episode(engine, env, EpisodeSpec(task), idle, RolloutConfig())
    assert session.state == SessionState.FINISHED
    score, checks = verdict(session)
    assert score == 0.0
    assert checks["state"] is False
    assert task_success(session) is False
    assert Ran.of(session).reason is not None
    assert Ran.of(session).reason.startswith("unsolved:")  # type: ignore[union-attr]
    assert "state" in Ran.of(session).reason  # type: ignore[operator]


async def test_tool_faults_fail_the_first_call_and_refuse_its_dependants(
    env: RetailEnv, engine: Orchestrator
) -> None:
    task = single_use(env.tasks(Split.TRAIN)[:5], env=env)[0]
    spec = EpisodeSpec(task, faults=Faults(tool_error=1.0))
    session = await run_episode(engine, env, spec, expert(env), NO_RETRIES)
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
    assert Ran.of(session).reason == "call_failed:UNAVAILABLE"


async def test_a_reordered_plan_arrives_reversed(env: RetailEnv, engine: Orchestrator) -> None:
    task = single_use(env.tasks(Split.TRAIN)[:5], env=env)[0]
    plan = env.expert(task)
    spec = EpisodeSpec(task, faults=Faults(plan_order=1.0))
    session = await run_episode(engine, env, spec, expert(env), RolloutConfig())
    assert session.plan is not None
    assert [g.id for g in session.plan.subgoals] == list(reversed(plan.step_ids))
    assert session.tool_calls[0].status == CallStatus.REFUSED  # the last step waits for the earlier ones
    assert verdict(session)[0] == 0.0


async def test_concurrent_episodes_of_one_task_keep_their_own_state(
    env: RetailEnv, engine: Orchestrator
) -> None:
    # each run cancels or changes the same orders: on shared state the second run's calls would fail
    task = env.tasks(Split.TRAIN)[0]
    assert env.gold_hash(task) != env.episode(task).state_hash()
    agent = expert(env)
    runs = (run_episode(engine, env, EpisodeSpec(task, seed=s), agent, RolloutConfig()) for s in range(4))
    sessions = await asyncio.gather(*runs)
    assert [verdict(s)[0] for s in sessions] == [1.0] * 4
    assert len({s.session_id for s in sessions}) == 4


def test_gold_replay_runs_the_gold_actions_repeated_tools_included(
    env: RetailEnv, store: SessionStore
) -> None:
    tasks = env.tasks(Split.TEST)[:4]
    assert any(len({a["name"] for a in t.payload["actions"]}) < len(t.payload["actions"]) for t in tasks)
    ran = asyncio.run(run_episodes(env, [EpisodeSpec(t) for t in tasks], gold(env), store))
    assert all(r.success for r in ran)
    for task, r in zip(tasks, ran, strict=True):
        session = store.get(r.session_id)
        actions = [(a["name"], a["kwargs"]) for a in task.payload["actions"]]
        assert [(c.tool, c.params) for c in session.tool_calls] == actions
        assert session.metadata["agent"] == "gold"


def test_gold_replay_needs_an_env_that_gives_gold_plans() -> None:
    with pytest.raises(NoGoldPlans, match=r"orders has no gold plans.*GoldPlans"):
        gold(OrdersEnv(DomainConfig(train=2, dev=0, test=0)))


def test_the_plan_guards_refuse_what_they_were_not_widened_for(env: RetailEnv, store: SessionStore) -> None:
    task = repeating(env.tasks(Split.TRAIN)[:12], env=env)[0]

    class Unwidened(ScriptedAgent):
        def engine_config(self, base: OrchestratorConfig, tasks: Sequence[Task]) -> OrchestratorConfig:
            return base

    narrow = Unwidened("expert", env.expert)
    (refused,) = asyncio.run(run_episodes(env, [EpisodeSpec(task)], narrow, store))
    assert refused == Ran(refused.session_id, False, "plan_rejected:repeated_tool")
    assert store.get(refused.session_id).tool_calls == ()
    (solved,) = asyncio.run(run_episodes(env, [EpisodeSpec(task)], expert(env), store))
    assert solved.success


def test_guards_for_plans_widen_the_limits_and_keep_the_rest(env: RetailEnv) -> None:
    plans = [env.expert(t) for t in env.tasks(Split.TRAIN)[:50]]
    longest = max(len(p.steps) for p in plans)
    assert longest > 10
    base = OrchestratorConfig(forbidden_tools=frozenset({"think"}), commit_batch=8)
    widened = guards_for_plans(base, plans)
    assert (widened.max_subgoals, widened.repeated_tools) == (longest, True)
    assert (widened.forbidden_tools, widened.commit_batch) == (base.forbidden_tools, 8)
    assert guards_for_plans(OrchestratorConfig(max_subgoals=64), plans).max_subgoals == 64


async def test_expected_entities_come_from_the_env_when_it_names_them(
    env: RetailEnv, engine: Orchestrator
) -> None:
    class NamingRetail(RetailEnv):
        def expected_entities(self, task: Task) -> Sequence[str]:
            return [task.payload["user_id"]]

    task = env.tasks(Split.TRAIN)[0]
    naming = NamingRetail(env.data)
    session = await run_episode(engine, naming, EpisodeSpec(task), expert(naming), RolloutConfig())
    assert session.metadata["expected_entities"] == [task.payload["user_id"]]


async def test_the_engine_must_route_skills_per_episode(env: RetailEnv, store: SessionStore) -> None:
    task = env.tasks(Split.TRAIN)[0]
    async with Orchestrator(store, SkillExecutor(env.episode(task).skills())) as plain:
        with pytest.raises(TypeError, match="EpisodeSkills"):
            await run_episode(plain, env, EpisodeSpec(task), expert(env), RolloutConfig())
    with pytest.raises(RuntimeError, match="no episode is bound"):
        _ = EpisodeSkills().contracts


def test_run_many_runs_the_first_tasks_into_the_store(env: RetailEnv, store: SessionStore) -> None:
    config = RolloutConfig(concurrency=2)
    summary = run_many(
        env, Split.TRAIN, expert(env), 3, store=store, config=config, seed=7, show_progress=False
    )
    assert (summary.env, summary.split, summary.agent, summary.n) == ("retail", Split.TRAIN, "expert", 3)
    stored = list(store.iter_sessions())
    by_task = {s.metadata["task_id"]: s for s in stored}
    assert sorted(by_task) == sorted(t.task_id for t in env.tasks(Split.TRAIN)[:3])
    assert summary.successes == sum(task_success(s) is True for s in stored) == 3
    assert summary.failed == ()
    assert summary.reasons == {}
    assert all(s.metadata["seed"] == stream_seed(7, t) for t, s in by_task.items())
    assert summary.success_rate == 1.0
    assert summary.as_dict()["success_rate"] == summary.success_rate


def test_run_many_counts_the_failures_by_reason(env: RetailEnv, store: SessionStore) -> None:
    idle = ScriptedAgent("expert", lambda _: ExpertPlan(goal="do nothing", steps=(), final_message=""))
    tasks = env.tasks(Split.TRAIN)[:4]
    summary = run_many(env, Split.TRAIN, idle, 4, store=store, show_progress=False)
    assert summary.failed == tuple(t.task_id for t in tasks)
    assert sum(summary.reasons.values()) == 4
    assert all(reason.startswith("unsolved:") for reason in summary.reasons)
    assert summary.as_dict()["reasons"] == dict(summary.reasons)
