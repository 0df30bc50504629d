"""The clinic environment: realistic seeded cases, conformance, the expert, the judge, faults."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from sessionrl.envs import ExpertPlan, Faults, Split
from sessionrl.envs.check import check_env, replay, run_plan
from sessionrl.envs.clinic import Case, ClinicEnv, Diagnosis, DomainConfig
from sessionrl.envs.clinic.case import NAMES, size_class
from sessionrl.envs.clinic.expert import topic
from sessionrl.envs.clinic.feedback import consistent
from sessionrl.skills import ErrorCode, SkillError, check_skill


@pytest.fixture(scope="module")
def env() -> ClinicEnv:
    return ClinicEnv(DomainConfig(time_factor=0.0))


def cases(env: ClinicEnv) -> list[Case]:
    return [Case.from_payload(task.payload) for split in Split for task in env.tasks(split)]


def test_splits_hold_every_diagnosis(env: ClinicEnv) -> None:
    assert [len(env.tasks(split)) for split in Split] == [400, 50, 100]
    for split in Split:
        counts = Counter(task.payload["diagnosis"] for task in env.tasks(split))
        assert set(counts) == set(Diagnosis)
        assert max(counts.values()) - min(counts.values()) <= 1


def test_cases_are_seeded() -> None:
    a = ClinicEnv(DomainConfig(seed=1, train=10, dev=2, test=2))
    b = ClinicEnv(DomainConfig(seed=1, train=10, dev=7, test=0))
    c = ClinicEnv(DomainConfig(seed=2, train=10, dev=2, test=2))
    assert [t.payload for t in a.tasks(Split.TRAIN)] == [t.payload for t in b.tasks(Split.TRAIN)]
    assert [t.payload for t in a.tasks(Split.TRAIN)] != [t.payload for t in c.tasks(Split.TRAIN)]


def test_every_case_satisfies_the_rule_of_its_diagnosis_and_no_rival_rule(env: ClinicEnv) -> None:
    for case in cases(env):
        assert consistent(case.diagnosis, case.labs)[0]
        rivals = [d for d in Diagnosis if d is not case.diagnosis and consistent(d, case.labs)[0]]
        assert rivals == []


def test_red_cell_size_and_mentzer_index_separate_the_anemias(env: ClinicEnv) -> None:
    for case in cases(env):
        size = size_class(case.labs["mcv"])
        if case.diagnosis in (Diagnosis.B12_DEFICIENCY, Diagnosis.FOLATE_DEFICIENCY):
            assert size == "macrocytic"
        elif case.diagnosis is not Diagnosis.CHRONIC_DISEASE:
            assert size == "microcytic"
        if case.diagnosis is Diagnosis.THALASSEMIA_TRAIT:
            assert case.mentzer < 13.0
        elif case.diagnosis is Diagnosis.IRON_DEFICIENCY:
            assert case.mentzer > 13.0


def test_requests_name_the_report_and_patient_in_both_languages(env: ClinicEnv) -> None:
    tasks = env.tasks(Split.TRAIN)
    for task in tasks:
        assert task.payload["report_id"] in task.instruction
        assert task.payload["patient_id"] in task.instruction
    chinese = sum("患者" in task.instruction for task in tasks)
    assert 0.1 * len(tasks) < chinese < 0.4 * len(tasks)  # a quarter are written in Chinese


def test_check_env_passes(env: ClinicEnv) -> None:
    check_env(env, tasks_per_split=5)


async def test_contracts_pass_check_skill_without_warnings(env: ClinicEnv) -> None:
    for contract in env.contracts():
        assert await check_skill(contract) == ()


def test_expert_solves_every_task_without_faults(env: ClinicEnv) -> None:
    for split in Split:
        failed = [t.task_id for t in env.tasks(split) if not replay(env.episode(t), env.expert(t))]
        assert failed == []


def test_expert_reads_the_guideline_of_the_size_class(env: ClinicEnv) -> None:
    for task in env.tasks(Split.DEV):
        plan = env.expert(task)
        case = Case.from_payload(task.payload)
        assert (
            plan.steps[1].params
            == {"topic": f"{size_class(case.labs['mcv'])}_anemia"}
            == {"topic": topic(case)}
        )
        assert plan.steps[-1].tool == "diagnosis_submit"
        assert NAMES[case.diagnosis][0] in plan.final_message


def test_submitting_ends_the_episode(env: ClinicEnv) -> None:
    task = env.tasks(Split.TRAIN)[0]
    episode = env.episode(task)
    assert not episode.terminated
    asyncio.run(run_plan(episode, env.expert(task)))
    assert episode.terminated
    assert not any(episode.action_mask().values())


def _without(plan: ExpertPlan, tool: str) -> ExpertPlan:
    steps = tuple(step for step in plan.steps if step.tool != tool)
    return ExpertPlan(plan.goal, steps, plan.final_message)


def test_judge_requires_the_confirming_tests(env: ClinicEnv) -> None:
    task = next(t for t in env.tasks(Split.TRAIN) if t.payload["diagnosis"] == Diagnosis.IRON_DEFICIENCY)
    episode = env.episode(task)
    plan = _without(env.expert(task), "crp_test_request")
    asyncio.run(run_plan(episode, plan))
    outcome = episode.outcome([plan.final_message])
    assert outcome.checks == {"diagnosis": True, "evidence": False, "no_risk": False, "message": True}
    assert "no crp result" in outcome.detail


def test_judge_rejects_a_wrong_diagnosis_and_a_silent_reply(env: ClinicEnv) -> None:
    task = next(t for t in env.tasks(Split.TRAIN) if t.payload["diagnosis"] == Diagnosis.B12_DEFICIENCY)
    plan = env.expert(task)
    submit = plan.steps[-1]
    wrong = type(submit)(
        submit.id, submit.description, submit.tool, {**submit.params, "diagnosis": "folate_deficiency"}
    )
    episode = env.episode(task)
    asyncio.run(run_plan(episode, ExpertPlan(plan.goal, (*plan.steps[:-1], wrong), plan.final_message)))
    outcome = episode.outcome(["Folate deficiency."])
    assert outcome.checks["diagnosis"] is False
    assert outcome.checks["message"] is False
    assert "submitted folate_deficiency" in outcome.detail


def test_chinese_reply_names_the_diagnosis(env: ClinicEnv) -> None:
    task = next(t for t in env.tasks(Split.TRAIN) if t.payload["diagnosis"] == Diagnosis.THALASSEMIA_TRAIT)
    episode = env.episode(task)
    asyncio.run(run_plan(episode, env.expert(task)))
    assert episode.success(["诊断：地中海贫血（轻型），HbA2升高。"])


async def test_tool_faults_fail_every_call_without_effect(env: ClinicEnv) -> None:
    task = env.tasks(Split.TRAIN)[0]
    episode = env.episode(task, seed=3, faults=Faults(tool_error=1.0))
    results = await run_plan(episode, env.expert(task))
    assert all(isinstance(r, SkillError) and r.code == ErrorCode.UNAVAILABLE for r in results)
    assert episode.state_hash() == env.episode(task).state_hash()
