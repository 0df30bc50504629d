"""The expert work-up of a case, and the clinical report both the expert and structured policies write.

The work-up parses the blood count, reads the guideline for the red-cell size class, orders the tests that
confirm the diagnosis (`tools.REQUIRED`), and submits it. The report states the findings of every panel
seen, what they exclude, and a follow-up plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sessionrl.envs.base import ExpertPlan, ExpertStep
from sessionrl.envs.clinic.case import NAMES, Case, Diagnosis, Panel, flag, size_class
from sessionrl.envs.clinic.tools import TEST_PANELS

TESTS: Final[Mapping[Diagnosis, tuple[str, ...]]] = {
    Diagnosis.IRON_DEFICIENCY: ("ferritin_test_request", "crp_test_request"),
    Diagnosis.CHRONIC_DISEASE: ("ferritin_test_request", "crp_test_request"),
    Diagnosis.THALASSEMIA_TRAIT: ("ferritin_test_request", "hb_electrophoresis_request"),
    Diagnosis.B12_DEFICIENCY: ("b12_test_request",),
    Diagnosis.FOLATE_DEFICIENCY: ("b12_test_request",),
}
"""The tests the expert orders for each diagnosis, in order."""

FOLLOW_UP: Final = "Follow-up: repeat the blood count in 4 to 8 weeks."


def topic(case: Case) -> str:
    """The guideline topic for the case's red-cell size class."""
    return f"{size_class(case.labs['mcv'])}_anemia"


def _findings(results: Mapping[Panel, Mapping[str, float]]) -> list[str]:
    lines = []
    if Panel.CBC in results:
        cbc = results[Panel.CBC]
        lines.append(f"Blood count: Hb {cbc['hb']} g/dL, MCV {cbc['mcv']} fL, RBC {cbc['rbc']} x10^12/L.")
    if Panel.IRON in results:
        iron = results[Panel.IRON]
        lines.append(f"Ferritin {iron['ferritin']:g} ng/mL, transferrin saturation {iron['tsat']}%.")
    if Panel.CRP in results:
        lines.append(f"CRP {results[Panel.CRP]['crp']} mg/L.")
    if Panel.VITAMINS in results:
        vitamins = results[Panel.VITAMINS]
        lines.append(f"B12 {vitamins['b12']:g} pg/mL, folate {vitamins['folate']} ng/mL.")
    if Panel.ELECTROPHORESIS in results:
        lines.append(f"HbA2 {results[Panel.ELECTROPHORESIS]['hba2']}%.")
    return lines


def _exclusions(results: Mapping[Panel, Mapping[str, float]]) -> list[str]:
    lines = []
    if Panel.CRP in results:
        raised = flag("crp", results[Panel.CRP]["crp"]) == "H"
        lines.append(
            "The raised CRP points to inflammation, as in anemia of chronic disease."
            if raised
            else "A normal CRP excludes anemia of chronic disease."
        )
    if Panel.IRON in results and flag("ferritin", results[Panel.IRON]["ferritin"]) != "L":
        lines.append("A normal ferritin rules out iron deficiency.")
    return lines


def report(diagnosis: Diagnosis | None, results: Mapping[Panel, Mapping[str, float]]) -> str:
    """The clinical report: the diagnosis (if any), the findings, what they exclude, the follow-up."""
    head = [f"Diagnosis: {NAMES[diagnosis][0]}."] if diagnosis is not None else ["No diagnosis yet."]
    return " ".join([*head, *_findings(results), *_exclusions(results), FOLLOW_UP])


def expert_plan(case: Case) -> ExpertPlan:
    """Parse, read the guideline, order the confirming tests, submit, and report."""
    steps = [
        ExpertStep("s1", "Parse the blood count", "lab_result_parser", {"report_id": case.report_id}),
        ExpertStep("s2", "Read the guideline", "guideline_retriever", {"topic": topic(case)}, ("s1",)),
    ]
    for tool in TESTS[case.diagnosis]:
        previous = steps[-1].id
        params = {"patient_id": case.patient_id}
        description = f"Order the {TEST_PANELS[tool].value} panel"
        steps.append(ExpertStep(f"s{len(steps) + 1}", description, tool, params, (previous,)))
    results = {
        panel: case.panel(panel) for panel in (Panel.CBC, *(TEST_PANELS[t] for t in TESTS[case.diagnosis]))
    }
    submit = {
        "patient_id": case.patient_id,
        "diagnosis": case.diagnosis.value,
        "confidence": 0.9,
        "rationale": " ".join(_findings(results)),
    }
    steps.append(
        ExpertStep(f"s{len(steps) + 1}", "Submit the diagnosis", "diagnosis_submit", submit, (steps[-1].id,))
    )
    return ExpertPlan(
        goal="Find the cause of the anemia and submit the diagnosis",
        steps=tuple(steps),
        final_message=report(case.diagnosis, results),
    )
