"""The structured policy through the orchestrator: sessions stored, judged and scored as the gym judges."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from research.structured_agent import PLAN, SUBGOAL, Progress, StructuredAgent, observe
from sessionrl.envs.base import Split
from sessionrl.envs.gym import DecisionGymEnv
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.episodes import EpisodeSpec, run_episodes
from sessionrl.episodes.verdict import task_success
from sessionrl.rewards.engine import RewardEngine
from sessionrl.session.model import FeedbackType, SessionState
from sessionrl.skills import ManualClock
from sessionrl.store import SessionStore
from sessionrl.train.structured.imitation import ImitationConfig, imitate
from sessionrl.train.structured.rollout import StructuredRun, StructuredRunConfig, evaluate

ENV = OrdersEnv(DomainConfig(train=36, dev=0, test=12, time_factor=0, transient_failures=False))
RUN = StructuredRunConfig(num_envs=1)


@pytest.fixture(scope="module")
def cloned() -> StructuredRun:
    """A policy cloned from the expert on all 36 training tasks: it solves some test tasks, not all."""
    return imitate(ENV, RUN, ImitationConfig(demos=36, epochs=120, lr=1e-2))


@pytest.fixture
def store() -> Iterator[SessionStore]:
    with SessionStore.open("sqlite://") as opened:
        yield opened


def test_observations_match_the_gym() -> None:
    """Before any call and after an inventory check, `observe` equals what `DecisionGymEnv` returns."""
    task = ENV.tasks(Split.TRAIN)[0]
    gym_env = DecisionGymEnv(ENV, Split.TRAIN, seed=0)
    gym_obs, _ = gym_env.reset(options={"task_id": task.task_id})
    episode = ENV.episode(task, seed=0)
    progress = Progress.start(len(gym_env.skill_names))
    ours = observe(episode, gym_env.skill_names, progress, gym_env.config.max_steps)
    for key, value in gym_obs.items():
        np.testing.assert_array_equal(ours[key], value)
    check = gym_env.skill_names.index("inventory_check")
    gym_obs, *_ = gym_env.step({"skill": check, "params": np.zeros(2, np.float32)})
    skill = {s.name: s for s in episode.skills()}["inventory_check"]
    asyncio.run(skill.invoke(episode.bind("inventory_check", {}), ManualClock()))
    progress.record(check, ok=True)
    ours = observe(episode, gym_env.skill_names, progress, gym_env.config.max_steps)
    for key, value in gym_obs.items():
        np.testing.assert_array_equal(ours[key], value)


def test_episodes_run_as_decision_sessions(cloned: StructuredRun, store: SessionStore) -> None:
    """Every test task becomes a finished session with the one-sub-goal plan, tool calls serving it, a
    task_outcome verdict that agrees with the gym's judgement of the same greedy policy, and a reward
    vector stored for the judged session."""
    tasks = list(ENV.tasks(Split.TEST))
    engine = RewardEngine()
    agent = StructuredAgent(ENV, cloned.policy, cloned.encoder)
    ran = asyncio.run(run_episodes(ENV, [EpisodeSpec(t) for t in tasks], agent, store))
    engine.store_all(store, (r.session_id for r in ran))
    sessions = [store.get(r.session_id) for r in ran]
    gym_verdicts = [e.success for e in evaluate(cloned.policy, cloned.encoder, ENV, Split.TEST)]
    verdicts = [task_success(store.get(s.session_id)) for s in sessions]
    assert verdicts == gym_verdicts
    assert 0 < sum(gym_verdicts) < len(tasks)  # a meaningful mix
    for session in sessions:
        stored = store.get(session.session_id)
        assert stored.state is SessionState.FINISHED
        assert stored.plan == PLAN
        assert stored.metadata["agent"] == "structured"
        assert stored.tool_calls
        assert {call.subgoal_id for call in stored.tool_calls} == {SUBGOAL}
        assert [f.type for f in stored.feedback] == [FeedbackType.TASK_OUTCOME]
        (reward,) = store.rewards(session.session_id)
        assert reward.session_version == stored.state_version  # scored after the verdict arrived
