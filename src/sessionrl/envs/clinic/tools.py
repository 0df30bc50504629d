"""The seven triage tools as plain functions over one episode's `Chart`.

A tool returns a JSON object, or raises `SkillError` with a code its contract declares and changes nothing.
Tests and the diagnosis need the blood count parsed first (`PRECONDITION_FAILED`); `Chart.mask` reports
that. A diagnosis submitted without the tests that confirm it is accepted but flagged as risky.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from sessionrl.envs.clinic.case import Case, Diagnosis, Panel, flag
from sessionrl.skills import SkillError

Json = dict[str, Any]

UNSUPPORTED_DIAGNOSIS: Final = "unsupported_diagnosis"
RISK_FLAGS: Final = (UNSUPPORTED_DIAGNOSIS,)

TEST_PANELS: Final = {
    "ferritin_test_request": Panel.IRON,
    "crp_test_request": Panel.CRP,
    "b12_test_request": Panel.VITAMINS,
    "hb_electrophoresis_request": Panel.ELECTROPHORESIS,
}
"""The panel each test tool reveals."""

REQUIRED: Final = {
    Diagnosis.IRON_DEFICIENCY: frozenset({Panel.IRON, Panel.CRP}),
    Diagnosis.CHRONIC_DISEASE: frozenset({Panel.IRON, Panel.CRP}),
    Diagnosis.THALASSEMIA_TRAIT: frozenset({Panel.IRON, Panel.ELECTROPHORESIS}),
    Diagnosis.B12_DEFICIENCY: frozenset({Panel.VITAMINS}),
    Diagnosis.FOLATE_DEFICIENCY: frozenset({Panel.VITAMINS}),
}
"""The panels beyond the blood count that a diagnosis must rest on (CRP tells iron deficiency from
inflammation, ferritin rules iron deficiency out before a thalassemia trait)."""

GUIDELINES: Final = {
    "microcytic_anemia": (
        "Order iron studies first; ferritin below 30 ng/mL confirms iron deficiency.",
        "Order a CRP: inflammation raises ferritin, so a normal CRP is needed to exclude anemia of chronic "
        "disease; ferritin above 100 ng/mL with CRP above 10 mg/L points to anemia of chronic disease.",
        "Normal ferritin with a Mentzer index (MCV/RBC) below 13: order hemoglobin electrophoresis; "
        "HbA2 above 3.5% confirms a beta-thalassemia trait.",
    ),
    "normocytic_anemia": (
        "Order iron studies and a CRP together.",
        "Ferritin above 100 ng/mL with CRP above 10 mg/L: anemia of chronic disease; "
        "ferritin below 30 ng/mL: early iron deficiency.",
    ),
    "macrocytic_anemia": (
        "Order vitamin B12 and folate together.",
        "B12 below 200 pg/mL: B12 deficiency. Folate below 3 ng/mL with normal B12: folate deficiency; never "
        "give folate before B12 deficiency is excluded.",
        "Plan a follow-up blood count after 4 to 8 weeks of replacement.",
    ),
}
"""What each guideline recommends."""


def flags(values: dict[str, float]) -> dict[str, str]:
    """The reference flags of `values` (only those outside their interval)."""
    return {name: mark for name, value in values.items() if (mark := flag(name, value)) is not None}


@dataclass
class Chart:
    """The mutable state of one episode: what was parsed, read, tested and submitted.

    `calls` lists every successful tool call in order as `(tool, params, output)`.
    """

    case: Case
    parsed: bool = False
    guidelines: list[str] = field(default_factory=list)
    results: dict[Panel, dict[str, float]] = field(default_factory=dict)
    submitted: Json | None = None
    evidence: frozenset[Panel] = frozenset()
    risk_flags: list[str] = field(default_factory=list)
    calls: list[tuple[str, Json, Json]] = field(default_factory=list)

    def state_hash(self) -> str:
        """SHA-256 of everything the tools changed (the call log excluded)."""
        state = {
            "parsed": self.parsed,
            "guidelines": self.guidelines,
            "results": {panel.value: values for panel, values in self.results.items()},
            "submitted": self.submitted,
            "risk_flags": self.risk_flags,
        }
        return hashlib.sha256(orjson.dumps(state, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def mask(self) -> dict[str, bool]:
        """Which tools may succeed now, by name."""
        open_case = self.submitted is None
        return {
            "lab_result_parser": open_case,
            "guideline_retriever": open_case,
            **dict.fromkeys(TEST_PANELS, self.parsed and open_case),
            "diagnosis_submit": self.parsed and open_case,
        }

    def patient(self, patient_id: str) -> Case:
        """The case, when `patient_id` is its patient and the blood count was parsed."""
        if patient_id != self.case.patient_id:
            raise SkillError("PATIENT_NOT_FOUND", f"no patient {patient_id}")
        if not self.parsed:
            raise SkillError("PRECONDITION_FAILED", "parse the patient's blood count report first")
        return self.case


def lab_result_parser(chart: Chart, report_id: str) -> Json:
    """The blood count of the case's report, with flags."""
    case = chart.case
    if report_id != case.report_id:
        raise SkillError("REPORT_NOT_FOUND", f"no report {report_id}")
    chart.parsed = True
    values = case.panel(Panel.CBC)
    chart.results[Panel.CBC] = values
    return {
        "report_id": report_id,
        "patient_id": case.patient_id,
        "age": case.age,
        "sex": case.sex,
        "values": values,
        "flags": flags(values),
    }


def guideline_retriever(chart: Chart, topic: str) -> Json:
    """The recommendations of one guideline."""
    chart.guidelines.append(topic)
    return {
        "topic": topic,
        "guideline_id": f"GL-{topic.upper()}-2024",
        "recommendations": list(GUIDELINES[topic]),
    }


def _test(panel: Panel) -> Callable[[Chart, str], Json]:
    def run(chart: Chart, patient_id: str) -> Json:
        values = chart.patient(patient_id).panel(panel)
        chart.results[panel] = values
        return {"patient_id": patient_id, "values": values, "flags": flags(values)}

    run.__doc__ = f"The {panel.value} panel of the patient, with flags."
    return run


def diagnosis_submit(
    chart: Chart, patient_id: str, diagnosis: str, confidence: float, rationale: str
) -> Json:
    """Record the patient's one diagnosis; flag it when its confirming tests were not done."""
    chart.patient(patient_id)
    if chart.submitted is not None:
        raise SkillError("ALREADY_SUBMITTED", f"patient {patient_id} already has a diagnosis")
    chart.evidence = frozenset(chart.results)
    if not REQUIRED[Diagnosis(diagnosis)] <= chart.evidence:
        chart.risk_flags.append(UNSUPPORTED_DIAGNOSIS)
    chart.submitted = {"diagnosis": diagnosis, "confidence": confidence, "rationale": rationale}
    return {"case_id": f"C-{patient_id.removeprefix('P-')}", "diagnosis": diagnosis, "accepted": True}


TOOLS: Final[dict[str, Callable[..., Json]]] = {
    "lab_result_parser": lab_result_parser,
    "guideline_retriever": guideline_retriever,
    **{tool: _test(panel) for tool, panel in TEST_PANELS.items()},
    "diagnosis_submit": diagnosis_submit,
}
"""Every tool by its contract name."""
