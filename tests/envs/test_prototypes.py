"""Action prototypes: mining on made-up sessions, and macro-actions that replay their calls with masks."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from sessionrl.envs.base import Split
from sessionrl.envs.gym import DecisionGymEnv
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.envs.prototypes import (
    MacroGymEnv,
    Prototype,
    action_space_sizes,
    mine_prototypes,
    session_calls,
)
from sessionrl.policy.structured import build_policy
from sessionrl.session.model import Session, ToolCall

CHECK = ("check", {"sku": "A"})


def sms(template: str, phone: str) -> tuple[str, dict[str, str]]:
    return ("sms", {"template": template, "phone": phone})


def update(order: str) -> tuple[str, dict[str, str]]:
    return ("update", {"order": order, "mode": "fast"})


SESSIONS = [
    [CHECK, sms("T203", "1"), update("O-1")],
    [("lookup", {}), CHECK, sms("T203", "2"), update("O-2")],
    [CHECK, sms("T203", "3"), update("O-3"), ("lookup", {})],
    [("lookup", {}), ("refund", {"amount": 5})],
]


def test_mining_ranks_by_calls_saved_and_finds_fixed_parameters() -> None:
    found = mine_prototypes(SESSIONS, min_support=2, max_length=3, top=3)
    # check+sms+update: 3 sessions, saves 2 calls each (6); check+sms and sms+update: 3 sessions, 1 call (3)
    assert [p.skills for p in found] == [("check", "sms", "update"), ("check", "sms"), ("sms", "update")]
    assert [p.support for p in found] == [3, 3, 3]
    # the template and the mode are the same every time; the phone and the order are not
    assert found[0].fixed == ((0, "sku", "A"), (1, "template", "T203"), (2, "mode", "fast"))
    assert found[0].name == "check+sms+update"
    assert found[0].value(1, "template") == (True, "T203")
    assert found[0].value(1, "phone") == (False, None)


def test_mining_counts_a_session_once_and_honours_min_support() -> None:
    repeated = [[("a", {}), ("b", {}), ("a", {}), ("b", {})], [("a", {}), ("b", {})]]
    assert mine_prototypes(repeated, min_support=2, max_length=2) == (Prototype(("a", "b"), (), 2),)
    assert mine_prototypes(SESSIONS, min_support=4) == ()
    with pytest.raises(ValueError, match="max_length"):
        mine_prototypes(SESSIONS, max_length=1)


def test_session_calls_keep_successful_calls_in_order() -> None:
    now = datetime.now(UTC)
    calls = (
        ToolCall(call_id="1", tool="check", params={"sku": "A"}, status="error"),
        ToolCall(call_id="2", tool="check", params={"sku": "A"}, status="success"),
        ToolCall(call_id="3", tool="sms", params={"template": "T"}, status="success"),
    )
    session = Session(
        session_id="s", trace_id="t", user_query="q", tool_calls=calls, created_at=now, updated_at=now
    )
    assert session_calls(session) == (("check", {"sku": "A"}), ("sms", {"template": "T"}))


@pytest.fixture(scope="module")
def orders() -> OrdersEnv:
    return OrdersEnv(DomainConfig(train=40, dev=0, test=0, time_factor=0, transient_failures=False))


def expert_plans(env: OrdersEnv) -> list[list[tuple[str, dict[str, object]]]]:
    return [[(s.tool, dict(s.params)) for s in env.expert(t).steps] for t in env.tasks(Split.TRAIN)]


def test_a_macro_replays_the_expert_calls_it_stands_for(orders: OrdersEnv) -> None:
    """Start a task whose plan begins with a prototype: the macro (free parameters encoded from the plan)
    leaves the episode where the atomic calls do, with the same summed reward and one decision."""
    prototypes = mine_prototypes(expert_plans(orders), top=8)
    task, first = next(
        (t, p)
        for t in orders.tasks(Split.TRAIN)
        for p in prototypes
        if p.fixed and tuple(s.tool for s in orders.expert(t).steps[: len(p.skills)]) == p.skills
    )
    steps = orders.expert(task).steps[: len(first.skills)]
    atomic = DecisionGymEnv(orders, Split.TRAIN, seed=0)
    obs, _ = atomic.reset(options={"task_id": task.task_id})
    total = 0.0
    for step in steps:
        obs, reward, *_ = atomic.step(atomic.action_for(step.tool, step.params))
        total += reward
    macro_env = MacroGymEnv(DecisionGymEnv(orders, Split.TRAIN, seed=0), prototypes)
    start, _ = macro_env.reset(options={"task_id": task.task_id})
    index = macro_env.skill_names.index(first.name)
    assert (
        start["action_mask"][index] == start["action_mask"][macro_env.inner.skill_names.index(steps[0].tool)]
    )
    free = []
    for at, step in enumerate(steps):
        bounds = macro_env.episode.param_bounds().get(step.tool, {})  # the same bounds the atomic run saw
        for spec in macro_env.inner.param_specs[step.tool]:
            if not first.value(at, spec.name)[0]:
                free.append(spec.encode(step.params[spec.name], bounds.get(spec.name)))
    params = np.zeros(macro_env.params_width, np.float32)
    params[: len(free)] = free
    after, reward, _, _, info = macro_env.step({"skill": index, "params": params})
    assert info["macro_steps"] == len(steps)
    assert reward == pytest.approx(total)
    assert np.array_equal(after["features"], obs["features"])
    assert after["succeeded"][index] == 1
    assert len(after["action_mask"]) == len(macro_env.skill_names) + 1
    atomic.close()
    macro_env.close()


def test_macro_space_sizes_and_a_policy_over_it(orders: OrdersEnv) -> None:
    prototypes = mine_prototypes(expert_plans(orders), top=8)
    inner = DecisionGymEnv(orders, Split.TRAIN, seed=0)
    env = MacroGymEnv(inner, prototypes)
    sizes = action_space_sizes(inner, prototypes)
    assert sizes == {"atomic": len(inner.skill_names) + 1, "with_prototypes": len(inner.skill_names) + 9}
    assert env.action_space["skill"].n == sizes["with_prototypes"]
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    policy = build_policy(env, text_dim=4, hidden=8)
    assert policy.layout.actions == sizes["with_prototypes"]
    # a finish through the macro env finishes the inner episode
    _, _, terminated, _, _ = env.step({"skill": env.finish_action, "params": np.zeros(env.params_width)})
    assert terminated
    with pytest.raises(ValueError, match="lacks"):
        MacroGymEnv(inner, (Prototype(("nope", "sms_send"), (), 2),))
    env.close()
