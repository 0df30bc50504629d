"""Late feedback on triage sessions: the rating scale, bilingual comments, arrival times and delivery."""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from sessionrl.envs import ExpertPlan, ExpertStep, Split, Task
from sessionrl.envs.check import run_plan
from sessionrl.envs.clinic import (
    PANEL,
    Annotator,
    Case,
    ClinicEnv,
    Diagnosis,
    DomainConfig,
    annotate,
    deliver,
    schedule,
    validate,
)
from sessionrl.envs.clinic.feedback import ELEMENTS, MIN_REVIEW_DELAY, UPLOAD_LAG_S, review
from sessionrl.rewards.judge.offline import OfflineJudge
from sessionrl.rewards.judge.table import load_penalty_table
from sessionrl.session import CallStatus, Feedback, FeedbackType, FinalOutput, Session, SessionState, ToolCall
from sessionrl.skills import ManualClock, SkillError

FINISHED = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def env() -> ClinicEnv:
    return ClinicEnv(DomainConfig(train=20, dev=0, test=0, time_factor=0.0))


def task_of(env: ClinicEnv, diagnosis: Diagnosis) -> Task:
    return next(t for t in env.tasks(Split.TRAIN) if t.payload["diagnosis"] == diagnosis)


def session_of(
    env: ClinicEnv, task: Task, steps: tuple[ExpertStep, ...], message: str, session_id: str = "s-1"
) -> Session:
    """Run `steps` on a fresh episode and record them as a finished session that ended at FINISHED."""
    plan = env.expert(task)
    results = asyncio.run(run_plan(env.episode(task), ExpertPlan(plan.goal, steps, message)))
    calls = []
    for index, (step, result) in enumerate(zip(steps, results, strict=True)):
        failed = isinstance(result, SkillError)
        calls.append(
            ToolCall(
                call_id=f"{session_id}.c{index}",
                tool=step.tool,
                params=dict(step.params),
                output=None if failed else result,
                status=CallStatus.ERROR if failed else CallStatus.SUCCESS,
            )
        )
    return Session(
        session_id=session_id,
        trace_id="1" * 32,
        state=SessionState.FINISHED,
        user_query=task.instruction,
        tool_calls=tuple(calls),
        final_output=FinalOutput(text=message),
        created_at=FINISHED - timedelta(minutes=3),
        updated_at=FINISHED,
    )


def expert_session(env: ClinicEnv, diagnosis: Diagnosis, session_id: str = "s-1") -> tuple[Session, Case]:
    task = task_of(env, diagnosis)
    plan = env.expert(task)
    return session_of(env, task, plan.steps, plan.final_message, session_id), Case.from_payload(task.payload)


def test_a_correct_complete_answer_earns_five(env: ClinicEnv) -> None:
    for diagnosis in Diagnosis:
        session, case = expert_session(env, diagnosis)
        assert review(session, case).score == 5


def test_missing_the_chronic_disease_exclusion_earns_four_with_the_comment(env: ClinicEnv) -> None:
    task = task_of(env, Diagnosis.IRON_DEFICIENCY)
    plan = env.expert(task)
    session = session_of(env, task, plan.steps, "Diagnosis: iron deficiency anemia. Ferritin is low.")
    verdict = review(session, Case.from_payload(task.payload))
    assert verdict.score == 4
    assert verdict.missing == "chronic_disease_exclusion"
    assert verdict.zh == "诊断正确，但未提及需排除慢性病贫血。"
    assert verdict.en == "Correct diagnosis, but did not mention excluding anemia of chronic disease."


def test_lower_ratings_for_missing_tests_wrong_and_absent_diagnoses(env: ClinicEnv) -> None:
    task = task_of(env, Diagnosis.IRON_DEFICIENCY)
    case = Case.from_payload(task.payload)
    plan = env.expert(task)
    no_crp = tuple(step for step in plan.steps if step.tool != "crp_test_request")
    assert review(session_of(env, task, no_crp, plan.final_message), case).score == 3
    submit = plan.steps[-1]
    wrong = ExpertStep(submit.id, "", submit.tool, {**submit.params, "diagnosis": "thalassemia_trait"})
    verdict = review(session_of(env, task, (*plan.steps[:-1], wrong), plan.final_message), case)
    assert (verdict.score, verdict.missing) == (2, "diagnosis")
    assert verdict.zh == "诊断错误，检查结果提示缺铁性贫血。"
    assert review(session_of(env, task, plan.steps[:-1], "Unclear."), case).score == 1


def test_comments_name_elements_the_reward_judge_knows() -> None:
    judge, table = OfflineJudge(), load_penalty_table()
    for diagnosis in (Diagnosis.IRON_DEFICIENCY, Diagnosis.CHRONIC_DISEASE, Diagnosis.B12_DEFICIENCY):
        element = ELEMENTS[diagnosis]
        for comment in (element.en, element.zh):
            assert [c.missing_element for c in judge.extract(comment, table)] == [element.name]


def test_annotations_arrive_late_in_each_annotator_language(env: ClinicEnv) -> None:
    session, case = expert_session(env, Diagnosis.CHRONIC_DISEASE)
    submit_call = session.tool_calls[-1].call_id
    by_name = {annotator.name: annotator for annotator in PANEL}
    feedback = annotate(session, case, seed=0)
    assert feedback == annotate(session, case, seed=0)
    assert feedback
    for item in feedback:
        annotator = by_name[item.annotator or ""]
        assert item.type is FeedbackType.HUMAN_RATING
        assert item.feedback_id == f"s-1:{annotator.name}"
        assert item.anchor.call_id == submit_call
        assert item.occurred_at >= FINISHED + MIN_REVIEW_DELAY
        lag = (item.received_at - item.occurred_at).total_seconds()
        assert UPLOAD_LAG_S[0] <= lag <= UPLOAD_LAG_S[1]
        assert item.data["language"] == annotator.language
        chinese = any("\u4e00" <= ch <= "\u9fff" for ch in item.comment or "")
        assert chinese is (annotator.language == "zh")


def test_coverage_delay_and_noise_follow_the_panel(env: ClinicEnv) -> None:
    session, case = expert_session(env, Diagnosis.B12_DEFICIENCY)
    reviews: Counter[str] = Counter()
    delays: dict[str, list[float]] = {}
    scores: Counter[float] = Counter()
    for index in range(300):
        renamed = session.model_copy(update={"session_id": f"s-{index}"})
        for item in annotate(renamed, case, seed=0):
            name = item.annotator or ""
            reviews[name] += 1
            delays.setdefault(name, []).append((item.occurred_at - FINISHED).total_seconds() / 3600)
            scores[item.score or 0.0] += 1
    for annotator in PANEL:
        assert reviews[annotator.name] == pytest.approx(300 * annotator.coverage, abs=35)
        assert statistics.mean(delays[annotator.name]) == pytest.approx(annotator.mean_delay_h, rel=0.3)
    # the true score is 5: noise can only pull it down to 4 (5 + 1 is clipped to 5)
    assert set(scores) == {4.0, 5.0}
    assert scores[4.0] < scores[5.0] * 0.2


def test_a_custom_panel_replaces_the_default(env: ClinicEnv) -> None:
    session, case = expert_session(env, Diagnosis.FOLATE_DEFICIENCY)
    only = Annotator("dr_kim", "en", mean_delay_h=1.0, coverage=1.0, noise=0.0)
    (item,) = annotate(session, case, panel=(only,))
    assert (item.annotator, item.score, item.comment) == ("dr_kim", 5.0, "Correct and complete.")


def test_validator_checks_the_diagnosis_against_the_labs_seen(env: ClinicEnv) -> None:
    session, _ = expert_session(env, Diagnosis.THALASSEMIA_TRAIT)
    (passed,) = validate(session)
    assert passed.type is FeedbackType.AUTO_VALIDATION
    assert passed.score == 1.0
    assert passed.data["rule"] == "HbA2 above 3.5%"
    assert passed.received_at - passed.occurred_at == timedelta(seconds=2)
    task = task_of(env, Diagnosis.FOLATE_DEFICIENCY)
    plan = env.expert(task)
    submit = plan.steps[-1]
    wrong = ExpertStep(submit.id, "", submit.tool, {**submit.params, "diagnosis": "b12_deficiency"})
    (failed,) = validate(session_of(env, task, (*plan.steps[:-1], wrong), plan.final_message))
    assert failed.score == 0.0  # B12 was measured and is normal
    assert validate(session_of(env, task, plan.steps[:-1], "")) == ()


def test_feedback_is_delivered_when_the_simulated_clock_reaches_it(env: ClinicEnv) -> None:
    session, case = expert_session(env, Diagnosis.IRON_DEFICIENCY)
    items = schedule(session, case, seed=4)
    assert [item.received_at for item in items] == sorted(item.received_at for item in items)
    assert items[0].type is FeedbackType.AUTO_VALIDATION  # two seconds after the end; reviews take minutes
    clock = ManualClock(start=100.0)

    async def receive() -> list[tuple[Feedback, float]]:
        return [(item, clock.now() - 100.0) async for item in deliver(items, clock, start=FINISHED)]

    arrivals = asyncio.run(receive())
    assert [item for item, _ in arrivals] == list(items)
    for item, elapsed in arrivals:
        assert elapsed == pytest.approx((item.received_at - FINISHED).total_seconds())
