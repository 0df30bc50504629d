"""Language-model episodes (scripted replies) and expert episodes through one engine into the store."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

from sessionrl.envs.base import Split, Task
from sessionrl.envs.faults import Faults
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.episodes import EpisodeSpec, Ran, RolloutConfig, entities_named, expert, run_episodes
from sessionrl.episodes.llm import UNPARSEABLE, PolicyAgent, prompt_messages
from sessionrl.episodes.verdict import task_success
from sessionrl.orchestrator.policy import ScriptedBackend
from sessionrl.policy.llm import final_action, tool_action
from sessionrl.policy.references import Context, abstract
from sessionrl.session.model import FeedbackType, Message, SessionCreate, SessionState
from sessionrl.store import SessionStore
from sessionrl.train.llm.data import call_message

CONFIG = RolloutConfig(full_schemas=False, domain_policy=False, max_steps=6, max_invalid=2)


@pytest.fixture
def store() -> Iterator[SessionStore]:
    with SessionStore.open("sqlite://") as opened:
        yield opened


@pytest.fixture(scope="module")
def env() -> OrdersEnv:
    return OrdersEnv(DomainConfig(train=12, dev=2, test=2))


def rollout(
    env: OrdersEnv,
    specs: list[EpisodeSpec],
    backend: ScriptedBackend | None,
    store: SessionStore,
    config: RolloutConfig,
    *,
    policy_version: int | None = None,
) -> list[Ran]:
    """The specs' episodes by the policy `backend` (the expert's when None), on one engine."""
    agent = expert(env) if backend is None else PolicyAgent(backend, policy_version)
    return asyncio.run(run_episodes(env, specs, agent, store, config))


def task_of(env: OrdersEnv, issue: str) -> Task:
    return next(t for t in env.tasks(Split.TRAIN) if t.payload["issue"] == issue)


def expert_script(env: OrdersEnv, task: Task, store: SessionStore) -> list[str]:
    """What a policy imitating the expert would write for `task`: its actions with references."""
    (ran,) = rollout(env, [EpisodeSpec(task, f"x-{task.task_id}")], None, store, CONFIG)
    session = store.get(ran.session_id)
    messages = [Message(role="user", content=task.instruction)]
    script = []
    for call in session.tool_calls:
        script.append(tool_action(call.tool, abstract(call.params, Context.from_messages(messages))))
        messages += [Message(role="assistant", content=script[-1]), call_message(call, 400)]
    assert session.final_output is not None
    script.append(final_action(abstract(session.final_output.text, Context.from_messages(messages))))
    return script


def test_a_policy_acting_like_the_expert_solves_the_task_and_the_session_says_so(
    env: OrdersEnv, store: SessionStore
) -> None:
    task = task_of(env, "lost_parcel")
    script = expert_script(env, task, store)
    assert any("{{user." in s for s in script)
    assert any("{{waybill_generate." in s for s in script)
    backend = ScriptedBackend(script, policy_version=4)
    spec = EpisodeSpec(task, "s-1", seed=3, metadata={"stage": "rl", "group": "0:t"})
    (ran,) = rollout(env, [spec], backend, store, CONFIG, policy_version=4)
    assert ran.success
    session = store.get("s-1")
    assert session.state is SessionState.FINISHED
    assert task_success(session) is True
    assert session.metadata["task_id"] == task.task_id
    assert session.metadata["policy_version"] == 4
    assert session.metadata["group"] == "0:t"
    assert session.metadata["expected_entities"] == entities_named(task, env.expert(task))
    assert session.metadata["agent"] == "llm"
    # every reply is recorded; the tool calls hold the resolved parameters the expert used
    assert [c.response for c in session.llm_calls] == script
    expert = store.get(f"x-{task.task_id}")
    assert [(c.tool, c.params) for c in session.tool_calls] == [(c.tool, c.params) for c in expert.tool_calls]
    assert session.final_output is not None
    assert expert.final_output is not None
    assert session.final_output.text == expert.final_output.text
    # each call saw the conversation so far: system prompt, request, earlier replies and tool messages
    last = session.llm_calls[-1].messages
    assert last[:2] == tuple(prompt_messages(env, task, CONFIG))
    assert [m.role for m in last[2:]] == ["assistant", "tool"] * len(session.tool_calls)


def test_replies_that_are_not_actions_end_the_episode_as_a_failure(
    env: OrdersEnv, store: SessionStore
) -> None:
    backend = ScriptedBackend(["hello there", '{"tool": }', "never asked"])
    (ran,) = rollout(env, [EpisodeSpec(task_of(env, "stock_inquiry"), "s-2")], backend, store, CONFIG)
    assert not ran.success
    session = store.get("s-2")
    assert [c.response for c in session.llm_calls] == ["hello there", '{"tool": }']
    assert session.tool_calls == ()
    told = session.llm_calls[1].messages[-1]
    assert told.role == "tool"
    assert UNPARSEABLE in told.content
    assert task_success(session) is False
    verdicts = [f for f in session.feedback if f.type == FeedbackType.AUTO_VALIDATION]
    assert [(f.score, f.anchor.call_id) for f in verdicts] == [(0.0, c.call_id) for c in session.llm_calls]


def test_an_episode_is_cut_after_max_steps(env: OrdersEnv, store: SessionStore) -> None:
    check = tool_action("inventory_check", {"sku": "{{user.item}}"})
    backend = ScriptedBackend([check] * 10)
    (ran,) = rollout(env, [EpisodeSpec(task_of(env, "stock_inquiry"), "s-3")], backend, store, CONFIG)
    session = store.get("s-3")
    assert not ran.success
    assert len(session.llm_calls) == len(session.tool_calls) == CONFIG.max_steps
    assert all(c.params["sku"].startswith("SKU-") for c in session.tool_calls)  # references resolved


def test_finished_episodes_are_not_run_again_and_interrupted_ones_get_a_fresh_id(
    env: OrdersEnv, store: SessionStore
) -> None:
    task = task_of(env, "stock_inquiry")
    first = rollout(env, [EpisodeSpec(task, "s-4")], None, store, CONFIG)
    again = rollout(env, [EpisodeSpec(task, "s-4")], ScriptedBackend([]), store, CONFIG)
    assert first == again
    assert first[0].success
    store.create(SessionCreate(user_query=task.instruction, session_id="s-5"))  # a crash left it open
    (ran,) = rollout(env, [EpisodeSpec(task, "s-5")], None, store, CONFIG)
    assert ran.session_id == "s-5.1"
    assert ran.success
    assert store.get("s-5").state is SessionState.CREATED


def test_expert_episodes_plan_call_and_answer(env: OrdersEnv, store: SessionStore) -> None:
    specs = [EpisodeSpec(t, f"e-{t.task_id}") for t in env.tasks(Split.TRAIN)[:6]]
    ran = rollout(env, specs, None, store, RolloutConfig(concurrency=2))
    assert all(r.success for r in ran)
    for spec in specs:
        session = store.get(spec.session_id)
        assert session.plan is not None
        assert session.metadata["agent"] == "expert"
        assert session.metadata["policy_version"] is None
        assert len(session.tool_calls) == len(session.plan.subgoals)
        assert all(entity in spec.task.instruction for entity in session.metadata["expected_entities"])


def test_the_expert_calls_a_step_again_after_a_transient_failure(env: OrdersEnv, store: SessionStore) -> None:
    task = task_of(env, "damaged_item")
    patient = RolloutConfig(full_schemas=False, domain_policy=False, expert_retries=3)
    hasty = RolloutConfig(full_schemas=False, domain_policy=False, expert_retries=0)
    flaky = Faults(tool_error=0.5)
    specs = [EpisodeSpec(task, f"e-{seed}", seed=seed, faults=flaky) for seed in range(8)]
    patient_ran = rollout(env, specs, None, store, patient)
    hasty_ran = rollout(
        env, [EpisodeSpec(s.task, f"h-{s.seed}", s.seed, flaky) for s in specs], None, store, hasty
    )
    retried = 0
    for ran in patient_ran:
        calls = store.get(ran.session_id).tool_calls
        for first, again in itertools.pairwise(calls):
            if first.error_code == "UNAVAILABLE":
                assert (again.tool, again.params) == (first.tool, first.params)
                retried += 1
    assert retried > 0
    for ran in hasty_ran:  # without retries a failed call is never repeated: each tool runs once
        tools = [c.tool for c in store.get(ran.session_id).tool_calls]
        assert len(tools) == len(set(tools))
    assert sum(r.success for r in patient_ran) > sum(r.success for r in hasty_ran)
