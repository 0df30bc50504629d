"""What a structured policy sees of a triage episode and how its choices become calls.

The policy picks a skill and the bounded parameters (guideline topic, diagnosis, confidence); the report
and patient numbers come from the request, and the rationale is the findings seen so far. Features say
what the results showed once the tool that shows it has answered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sessionrl.envs.clinic.case import CHRONIC_CONDITIONS, Diagnosis, Panel, flag, size_class
from sessionrl.envs.clinic.expert import report
from sessionrl.envs.clinic.tools import TEST_PANELS, Chart

Json = dict[str, Any]

SIZE_CLASSES: Final = ("microcytic", "normocytic", "macrocytic")
FEATURES: Final = (
    "chronic_condition",
    *(f"size:{size}" for size in SIZE_CLASSES),
    "mentzer_below_13",
    "ferritin_low",
    "ferritin_high",
    "crp_high",
    "b12_low",
    "folate_low",
    "hba2_high",
    "parsed",
    "guideline_read",
    *(f"done:{panel.value}" for panel in TEST_PANELS.values()),
)
"""Names of the features, in order. The chronic condition comes from the request; the size class and the
Mentzer index from the parsed blood count; each result flag once its test answered."""


def _high(chart: Chart, panel: Panel, name: str, mark: str) -> bool:
    values = chart.results.get(panel)
    return values is not None and flag(name, values[name]) == mark


def features(chart: Chart) -> tuple[float, ...]:
    """The episode's features in `FEATURES` order, each 0 or 1."""
    case = chart.case
    chronic = any(condition in case.history for condition in CHRONIC_CONDITIONS)
    size = size_class(case.labs["mcv"]) if chart.parsed else None
    values = (
        chronic,
        *(size == s for s in SIZE_CLASSES),
        chart.parsed and case.mentzer < 13.0,
        _high(chart, Panel.IRON, "ferritin", "L"),
        chart.results.get(Panel.IRON, {}).get("ferritin", 0.0) >= 100.0,
        _high(chart, Panel.CRP, "crp", "H"),
        _high(chart, Panel.VITAMINS, "b12", "L"),
        _high(chart, Panel.VITAMINS, "folate", "L"),
        _high(chart, Panel.ELECTROPHORESIS, "hba2", "H"),
        chart.parsed,
        bool(chart.guidelines),
        *(panel in chart.results for panel in TEST_PANELS.values()),
    )
    return tuple(float(value) for value in values)


def bind(chart: Chart, skill: str, chosen: Mapping[str, Any]) -> Json:
    """Complete a call to `skill` from the policy's `chosen` bounded parameters and the request."""
    case = chart.case
    if skill == "lab_result_parser":
        return {"report_id": case.report_id}
    if skill == "guideline_retriever":
        return {"topic": chosen["topic"]}
    if skill in TEST_PANELS:
        return {"patient_id": case.patient_id}
    if skill == "diagnosis_submit":
        rationale = report(None, chart.results).removeprefix("No diagnosis yet. ")
        return {
            "patient_id": case.patient_id,
            "diagnosis": chosen["diagnosis"],
            "confidence": float(chosen["confidence"]),
            "rationale": rationale[:600],
        }
    raise KeyError(f"no clinic skill named {skill!r}")


def summary(chart: Chart) -> str:
    """The clinical report of what the episode submitted and saw."""
    diagnosis = None if chart.submitted is None else Diagnosis(chart.submitted["diagnosis"])
    return report(diagnosis, chart.results)
