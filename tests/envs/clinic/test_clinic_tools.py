"""Every clinic tool on a generated case: its answer, its masks and risk flag, and each error it raises."""

from __future__ import annotations

import random

import pytest

from sessionrl.envs.clinic.case import PANELS, Case, Diagnosis, Panel, draw_labs, flag
from sessionrl.envs.clinic.tools import GUIDELINES, TOOLS, UNSUPPORTED_DIAGNOSIS, Chart
from sessionrl.skills import SkillError


def case(diagnosis: Diagnosis = Diagnosis.IRON_DEFICIENCY) -> Case:
    return Case(
        diagnosis=diagnosis,
        patient_id="P-581230",
        report_id="LAB-204711",
        age=54,
        sex="female",
        history="fatigue",
        labs=draw_labs(diagnosis, random.Random(0)),
    )


def fails(code: str, chart: Chart, tool: str, **params: object) -> None:
    before = chart.state_hash()
    with pytest.raises(SkillError) as caught:
        TOOLS[tool](chart, **params)
    assert caught.value.code == code
    assert chart.state_hash() == before


def parsed(diagnosis: Diagnosis = Diagnosis.IRON_DEFICIENCY) -> Chart:
    chart = Chart(case(diagnosis))
    TOOLS["lab_result_parser"](chart, report_id="LAB-204711")
    return chart


def test_parser_returns_the_blood_count_with_flags() -> None:
    chart = Chart(case())
    answer = TOOLS["lab_result_parser"](chart, report_id="LAB-204711")
    assert answer["patient_id"] == "P-581230"
    assert set(answer["values"]) == set(PANELS[Panel.CBC])
    assert answer["flags"]["mcv"] == "L"  # iron deficiency is microcytic: MCV below 80 fL
    assert all(flag(name, answer["values"][name]) == mark for name, mark in answer["flags"].items())
    assert chart.parsed


def test_parser_unknown_report() -> None:
    fails("REPORT_NOT_FOUND", Chart(case()), "lab_result_parser", report_id="LAB-000000")


def test_guideline_retriever_answers_each_topic() -> None:
    chart = Chart(case())
    for topic in GUIDELINES:
        answer = TOOLS["guideline_retriever"](chart, topic=topic)
        assert answer["recommendations"] == list(GUIDELINES[topic])
    assert chart.guidelines == list(GUIDELINES)


@pytest.mark.parametrize(
    ("tool", "panel"),
    [
        ("ferritin_test_request", Panel.IRON),
        ("crp_test_request", Panel.CRP),
        ("b12_test_request", Panel.VITAMINS),
        ("hb_electrophoresis_request", Panel.ELECTROPHORESIS),
    ],
)
def test_each_test_reveals_its_panel_after_parsing(tool: str, panel: Panel) -> None:
    fails("PRECONDITION_FAILED", Chart(case()), tool, patient_id="P-581230")
    chart = parsed()
    fails("PATIENT_NOT_FOUND", chart, tool, patient_id="P-000000")
    answer = TOOLS[tool](chart, patient_id="P-581230")
    assert answer["values"] == chart.case.panel(panel)
    assert chart.results[panel] == answer["values"]


def test_masks_follow_parsing_and_submission() -> None:
    chart = Chart(case())
    assert chart.mask() == {
        "lab_result_parser": True,
        "guideline_retriever": True,
        "ferritin_test_request": False,
        "crp_test_request": False,
        "b12_test_request": False,
        "hb_electrophoresis_request": False,
        "diagnosis_submit": False,
    }
    TOOLS["lab_result_parser"](chart, report_id="LAB-204711")
    assert all(chart.mask().values())
    TOOLS["diagnosis_submit"](
        chart, patient_id="P-581230", diagnosis="b12_deficiency", confidence=0.2, rationale=""
    )
    assert not any(chart.mask().values())


def test_a_confirmed_diagnosis_is_clean() -> None:
    chart = parsed()
    TOOLS["ferritin_test_request"](chart, patient_id="P-581230")
    TOOLS["crp_test_request"](chart, patient_id="P-581230")
    answer = TOOLS["diagnosis_submit"](
        chart,
        patient_id="P-581230",
        diagnosis="iron_deficiency_anemia",
        confidence=0.9,
        rationale="low ferritin",
    )
    assert answer == {"case_id": "C-581230", "diagnosis": "iron_deficiency_anemia", "accepted": True}
    assert chart.risk_flags == []
    assert chart.evidence == {Panel.CBC, Panel.IRON, Panel.CRP}


def test_an_unconfirmed_diagnosis_is_flagged_and_only_one_is_accepted() -> None:
    chart = parsed()
    TOOLS["ferritin_test_request"](chart, patient_id="P-581230")
    submit = {
        "patient_id": "P-581230",
        "diagnosis": "iron_deficiency_anemia",
        "confidence": 0.9,
        "rationale": "",
    }
    TOOLS["diagnosis_submit"](chart, **submit)  # no CRP: anemia of chronic disease not excluded
    assert chart.risk_flags == [UNSUPPORTED_DIAGNOSIS]
    fails("ALREADY_SUBMITTED", chart, "diagnosis_submit", **submit)


def test_diagnosis_needs_a_parsed_blood_count() -> None:
    submit = {"patient_id": "P-581230", "diagnosis": "b12_deficiency", "confidence": 0.5, "rationale": ""}
    fails("PRECONDITION_FAILED", Chart(case()), "diagnosis_submit", **submit)
    fails("PATIENT_NOT_FOUND", parsed(), "diagnosis_submit", **{**submit, "patient_id": "P-000001"})
