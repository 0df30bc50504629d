"""The Gymnasium wrapper over orders and clinic: the checker, masks, decoding, rewards and endings."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from sessionrl.envs import Faults, Split
from sessionrl.envs.clinic import ClinicEnv
from sessionrl.envs.gym import (
    DecisionGymEnv,
    DecisionVectorEnv,
    GymConfig,
    ParamSpec,
    StructuredEnv,
    param_specs,
)
from sessionrl.envs.orders import DomainConfig, IssueType, OrdersEnv

CONFIG = DomainConfig(train=24, dev=6, test=6, time_factor=0.0)


@pytest.fixture(scope="module", params=["orders", "clinic"])
def domain(request: pytest.FixtureRequest) -> StructuredEnv:
    return OrdersEnv(CONFIG) if request.param == "orders" else ClinicEnv(CONFIG)


def test_passes_the_gymnasium_checker(domain: StructuredEnv) -> None:
    check_env(DecisionGymEnv(domain, seed=0), skip_render_check=True)


def test_passes_the_checker_with_transient_failures_and_faults() -> None:
    noisy = OrdersEnv(DomainConfig(train=6, dev=0, test=0, time_factor=0.0, transient_failures=True))
    faults = Faults(tool_error=0.3, garbled_output=0.2)
    check_env(DecisionGymEnv(noisy, seed=1, faults=faults), skip_render_check=True)


def test_spaces_follow_the_contracts(domain: StructuredEnv) -> None:
    gym = DecisionGymEnv(domain, seed=0)
    n = len(domain.contracts())
    assert gym.skill_names == tuple(sorted(c.name for c in domain.contracts()))
    assert gym.action_space["skill"].n == n + 1
    assert gym.observation_space["action_mask"].n == n + 1
    assert gym.observation_space["features"].shape == (len(domain.feature_names),)
    widest = max(len(specs) for specs in gym.param_specs.values())
    assert gym.action_space["params"].shape == (widest,)


def test_expert_plans_replayed_as_actions_solve_every_task(domain: StructuredEnv) -> None:
    gym = DecisionGymEnv(domain, seed=0)
    for task in domain.tasks(Split.TRAIN):
        gym.reset(options={"task_id": task.task_id})
        total, terminated = 0.0, False
        for step in domain.expert(task).steps:
            _, reward, terminated, truncated, info = gym.step(gym.action_for(step.tool, step.params))
            total += reward
            assert info["status"] == "success"
            assert not truncated
        if not terminated:
            _, reward, terminated, _, info = gym.step({"skill": gym.finish_action, "params": np.zeros(2)})
            total += reward
        assert terminated
        assert info["success"], (task.task_id, info)
        assert total == 1.0  # success reward, no failure or risk penalty


def test_calls_share_one_event_loop_until_close(domain: StructuredEnv) -> None:
    task = domain.tasks(Split.TRAIN)[0]
    first_step = domain.expert(task).steps[0]
    with DecisionGymEnv(domain, seed=0) as gym:
        gym.reset(options={"task_id": task.task_id})
        loops = []
        for _ in range(2):
            gym.step(gym.action_for(first_step.tool, first_step.params))
            loops.append(gym._loop)
        assert loops[0] is not None
        assert loops[0] is loops[1]
    assert loops[0].is_closed()
    assert gym._loop is None
    gym.reset(options={"task_id": task.task_id})
    _, _, _, _, info = gym.step(gym.action_for(first_step.tool, first_step.params))
    assert info["status"] == "success"  # a call after close runs on a new loop
    twin = copy.deepcopy(gym)  # a copy gets no loop of the original's, and makes its own
    assert twin._loop is None
    assert twin.step(gym.action_for(first_step.tool, first_step.params))[4]["status"] == "success"
    assert twin._loop is not None
    assert twin._loop is not gym._loop
    twin.close()
    gym.close()


def test_reset_is_seeded_and_options_pick_the_task(domain: StructuredEnv) -> None:
    a, b = DecisionGymEnv(domain), DecisionGymEnv(domain)
    ids = [a.reset(seed=s)[1]["task_id"] for s in range(5)]
    assert ids == [b.reset(seed=s)[1]["task_id"] for s in range(5)]
    assert len(set(ids)) > 1
    task = domain.tasks(Split.DEV)[2]
    gym = DecisionGymEnv(domain, Split.DEV)
    assert gym.reset(options={"task_id": task.task_id})[1]["task_id"] == task.task_id
    with pytest.raises(ValueError, match="no task"):
        gym.reset(options={"task_id": "nope"})


def test_a_masked_skill_is_refused_and_costs_the_failure_penalty() -> None:
    gym = DecisionGymEnv(OrdersEnv(CONFIG), seed=0)
    obs, _ = gym.reset(seed=0)
    refund = gym.skill_names.index("refund_trigger")
    assert obs["action_mask"][refund] == 0  # no inventory check yet
    obs, reward, terminated, truncated, info = gym.step({"skill": refund, "params": np.zeros(2)})
    assert info == {"skill": "refund_trigger", "status": "refused", "error_code": "MASKED", "risk_flags": 0}
    assert reward == -0.05
    assert obs["failed"][refund] == 1
    assert obs["step"][0] == pytest.approx(1 / 12)
    assert not terminated
    assert not truncated


def test_risky_calls_cost_the_risk_penalty() -> None:
    orders = OrdersEnv(CONFIG)
    gym = DecisionGymEnv(orders, seed=0)
    task = next(t for t in orders.tasks(Split.TRAIN) if t.payload["issue"] == IssueType.WRONG_ITEM)
    gym.reset(options={"task_id": task.task_id})
    ship = gym.action_for("waybill_generate", {"courier": task.payload["courier"], "size": "XL"})
    _, reward, _, _, info = gym.step(ship)  # before the return is confirmed
    assert info["status"] == "success"
    assert reward == -0.5
    assert gym.episode.risk_flags == ("unconfirmed_reshipment",)


def test_failed_calls_cost_the_failure_penalty_and_are_observed() -> None:
    orders = OrdersEnv(CONFIG)
    gym = DecisionGymEnv(orders, seed=0)
    task = next(t for t in orders.tasks(Split.TRAIN) if t.payload["issue"] == IssueType.STOCK_INQUIRY)
    obs, _ = gym.reset(options={"task_id": task.task_id})
    trace = gym.skill_names.index("express_contact")
    obs, reward, *_, info = gym.step({"skill": trace, "params": np.array([-1.0, 0.0])})
    assert (info["status"], info["error_code"]) == ("error", "WAYBILL_NOT_FOUND")  # no order, no parcel
    assert reward == -0.05
    assert obs["failed"][trace] == 1
    assert obs["succeeded"][trace] == 0


def test_truncation_is_kept_apart_from_termination() -> None:
    gym = DecisionGymEnv(OrdersEnv(CONFIG), seed=0, config=GymConfig(max_steps=3))
    gym.reset(seed=0)
    check = {"skill": gym.skill_names.index("inventory_check"), "params": np.zeros(2)}
    endings = [gym.step(check)[2:4] for _ in range(3)]
    assert endings == [(False, False), (False, False), (False, True)]


def test_finishing_early_is_judged_and_fails() -> None:
    gym = DecisionGymEnv(ClinicEnv(CONFIG), seed=0)
    gym.reset(seed=0)
    _, reward, terminated, truncated, info = gym.step({"skill": gym.finish_action, "params": np.zeros(2)})
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["success"] is False
    assert info["message"].startswith("No diagnosis yet.")


def test_submitting_a_diagnosis_ends_the_clinic_episode() -> None:
    clinic = ClinicEnv(CONFIG)
    gym = DecisionGymEnv(clinic, seed=0)
    task = clinic.tasks(Split.TRAIN)[0]
    gym.reset(options={"task_id": task.task_id})
    gym.step(gym.action_for("lab_result_parser", {}))
    submit = gym.action_for("diagnosis_submit", {"diagnosis": task.payload["diagnosis"], "confidence": 0.8})
    obs, reward, terminated, _, info = gym.step(submit)
    assert terminated
    assert info["success"] is False  # right diagnosis, but without its confirming tests
    assert info["checks"]["diagnosis"] is True
    assert reward == -0.5  # the unsupported diagnosis is flagged; no success reward
    assert obs["action_mask"].tolist() == [0] * len(gym.skill_names) + [1]


def test_decode_maps_the_box_onto_contract_ranges_and_episode_bounds() -> None:
    orders = OrdersEnv(CONFIG)
    gym = DecisionGymEnv(orders, seed=0)
    task = next(t for t in orders.tasks(Split.TRAIN) if t.payload["issue"] == IssueType.LATE_DELIVERY)
    gym.reset(options={"task_id": task.task_id})
    amount = round(task.payload["unit_price"] * task.payload["quantity"], 2)
    # params[0] is `amount`, params[1] is `reason`: both sorted by name
    assert gym.decode("refund_trigger", [1.0, -1.0]) == {"amount": pytest.approx(amount), "reason": "quality"}
    assert gym.decode("refund_trigger", [-1.0, 0.99]) == {
        "amount": pytest.approx(0.01),
        "reason": "late_delivery",
    }
    stamp = gym.decode("erp_sync", [0.0, 1.0])
    assert stamp == {"document_type": "reshipment", "timestamp": task.payload["now"]}


@pytest.mark.parametrize(
    ("spec", "x", "expected"),
    [
        (ParamSpec("k", choices=("a", "b", "c", "d")), -1.0, "a"),
        (ParamSpec("k", choices=("a", "b", "c", "d")), -0.5, "b"),  # bins of width 0.5: [-0.5, 0) is b
        (ParamSpec("k", choices=("a", "b", "c", "d")), 1.0, "d"),
        (ParamSpec("k", choices=("a", "b")), float("nan"), "b"),  # non-finite reads as 0
        (ParamSpec("n", low=10.0, high=20.0), 5.0, 20.0),  # clipped to 1
        (ParamSpec("n", low=0.0, high=7.0, integer=True), 0.0, 4),  # 3.5 rounds to even: 4
    ],
)
def test_param_spec_decoding(spec: ParamSpec, x: float, expected: Any) -> None:
    assert spec.decode(x) == expected


def test_encode_inverts_decode() -> None:
    choice = ParamSpec("k", choices=("a", "b", "c"))
    number = ParamSpec("n", low=0.01, high=50.0)
    assert [choice.decode(choice.encode(v)) for v in "abc"] == list("abc")
    assert number.decode(number.encode(12.34)) == pytest.approx(12.34)
    assert number.encode(3.0, bounds=(1.0, 5.0)) == 0.0


def test_param_specs_read_enums_and_bounded_numbers_only() -> None:
    contract = {c.name: c for c in OrdersEnv(CONFIG).contracts()}["refund_trigger"]
    assert param_specs(contract) == (
        ParamSpec("amount", 0.01, 5000.0),
        ParamSpec("reason", choices=("quality", "wrong_item", "late_delivery")),
    )


def test_vector_steps_like_its_environments_and_restarts_ended_ones() -> None:
    domain = OrdersEnv(CONFIG)
    singles = [DecisionGymEnv(domain, seed=i) for i in range(3)]
    vector = DecisionVectorEnv([DecisionGymEnv(domain, seed=i) for i in range(3)])
    obs, info = vector.reset()
    for i, single in enumerate(singles):
        alone, alone_info = single.reset()
        assert alone_info["task_id"] == info["task_id"][i]
        assert all(np.array_equal(obs[key][i], alone[key]) for key in alone)
    rng, restarted = np.random.default_rng(0), 0
    for _ in range(30):
        skills = np.array([rng.integers(single.finish_action + 1) for single in singles])
        params = rng.uniform(-1, 1, (3, vector.single_action_space["params"].shape[0])).astype(np.float32)
        obs, rewards, terminated, truncated, infos = vector.step({"skill": skills, "params": params})
        for i, single in enumerate(singles):
            alone, reward, ended, cut, alone_info = single.step({"skill": skills[i], "params": params[i]})
            assert (reward, ended, cut) == (rewards[i], terminated[i], truncated[i])
            assert infos["risk_flags"][i] == alone_info["risk_flags"]
            assert infos["calls"][i] == int(skills[i] != single.finish_action)
            assert infos["_success"][i] == (ended or cut)
            if ended or cut:
                assert infos["success"][i] == alone_info.get("success", False)
                assert all(np.array_equal(infos["final_obs"][i][k], alone[k]) for k in alone)
                alone, alone_info = single.reset()
                assert infos["task_id"][i] == alone_info["task_id"]
                restarted += 1
            assert all(np.array_equal(obs[key][i], alone[key]) for key in alone)
    assert restarted > 0
    assert obs["action_mask"].shape == (3, singles[0].finish_action + 1)
    vector.close()
    assert vector._loop is None
