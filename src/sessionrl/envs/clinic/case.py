"""A triage case: the patient, every lab value the tests can reveal, and the diagnosis behind them.

Values are drawn per diagnosis from ranges typical of that anemia in adults, so the classic reasoning holds:
a low MCV with low ferritin is iron deficiency, a high ferritin with a raised CRP is anemia of chronic
disease, a low MCV with a high red-cell count (Mentzer index MCV/RBC below 13) and a raised HbA2 is a
thalassemia trait, a high MCV with low B12 or low folate is a vitamin deficiency.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final


class Diagnosis(StrEnum):
    """The anemias a case can have."""

    IRON_DEFICIENCY = "iron_deficiency_anemia"
    CHRONIC_DISEASE = "anemia_of_chronic_disease"
    THALASSEMIA_TRAIT = "thalassemia_trait"
    B12_DEFICIENCY = "b12_deficiency"
    FOLATE_DEFICIENCY = "folate_deficiency"


class Panel(StrEnum):
    """A group of lab values one tool reveals."""

    CBC = "cbc"
    IRON = "iron"
    CRP = "crp"
    VITAMINS = "vitamins"
    ELECTROPHORESIS = "electrophoresis"


PANELS: Final[Mapping[Panel, tuple[str, ...]]] = {
    Panel.CBC: ("hb", "mcv", "mch", "rdw", "rbc", "wbc", "plt"),
    Panel.IRON: ("ferritin", "serum_iron", "tibc", "tsat"),
    Panel.CRP: ("crp",),
    Panel.VITAMINS: ("b12", "folate"),
    Panel.ELECTROPHORESIS: ("hba2", "hbf"),
}
"""Which values each panel holds."""

REFERENCE: Final[Mapping[str, tuple[float, float]]] = {
    "hb": (12.0, 17.5),
    "mcv": (80.0, 100.0),
    "mch": (27.0, 33.0),
    "rdw": (11.5, 14.5),
    "rbc": (4.0, 5.9),
    "wbc": (4.0, 11.0),
    "plt": (150.0, 400.0),
    "ferritin": (30.0, 300.0),
    "serum_iron": (60.0, 170.0),
    "tibc": (250.0, 450.0),
    "tsat": (20.0, 50.0),
    "crp": (0.0, 5.0),
    "b12": (200.0, 900.0),
    "folate": (3.0, 20.0),
    "hba2": (1.5, 3.5),
    "hbf": (0.0, 1.0),
}
"""Adult reference interval of every value (a value outside is flagged L or H)."""

_COMMON: Final[Mapping[str, tuple[float, float]]] = {
    "wbc": (4.5, 9.5),
    "plt": (160.0, 380.0),
    "crp": (0.3, 4.0),
    "b12": (260.0, 750.0),
    "folate": (5.0, 15.0),
    "hba2": (2.0, 3.2),
    "hbf": (0.1, 0.8),
    "ferritin": (40.0, 220.0),
    "serum_iron": (70.0, 150.0),
    "tibc": (260.0, 400.0),
    "tsat": (22.0, 40.0),
}
"""Ranges of values a diagnosis leaves normal."""

PROFILES: Final[Mapping[Diagnosis, Mapping[str, tuple[float, float]]]] = {
    Diagnosis.IRON_DEFICIENCY: {
        "hb": (7.5, 11.0), "mcv": (62.0, 77.0), "mch": (18.0, 25.0), "rdw": (15.5, 20.0),
        "rbc": (3.6, 4.4), "ferritin": (3.0, 18.0), "serum_iron": (15.0, 45.0), "tibc": (420.0, 520.0),
        "tsat": (3.0, 12.0), "hba2": (1.8, 2.8), "plt": (300.0, 480.0),
    },
    Diagnosis.CHRONIC_DISEASE: {
        "hb": (9.0, 11.5), "mcv": (76.0, 90.0), "mch": (25.0, 30.0), "rdw": (13.0, 15.0),
        "rbc": (3.5, 4.3), "ferritin": (150.0, 600.0), "serum_iron": (25.0, 55.0), "tibc": (180.0, 245.0),
        "tsat": (10.0, 18.0), "crp": (18.0, 90.0),
    },
    Diagnosis.THALASSEMIA_TRAIT: {
        "hb": (10.0, 12.5), "mcv": (60.0, 71.0), "mch": (19.0, 23.0), "rdw": (12.0, 14.4),
        "rbc": (5.5, 6.4), "hba2": (3.9, 6.0), "hbf": (0.5, 2.5),
    },
    Diagnosis.B12_DEFICIENCY: {
        "hb": (7.5, 11.0), "mcv": (104.0, 120.0), "mch": (34.0, 40.0), "rdw": (15.0, 19.0),
        "rbc": (2.2, 3.3), "b12": (70.0, 170.0), "wbc": (3.6, 6.5), "plt": (110.0, 200.0),
    },
    Diagnosis.FOLATE_DEFICIENCY: {
        "hb": (8.0, 11.0), "mcv": (102.0, 115.0), "mch": (33.0, 38.0), "rdw": (14.8, 18.0),
        "rbc": (2.5, 3.5), "folate": (1.0, 2.6),
    },
}  # fmt: skip
"""Ranges of the values each diagnosis moves."""

NAMES: Final[Mapping[Diagnosis, tuple[str, ...]]] = {
    Diagnosis.IRON_DEFICIENCY: (
        "iron deficiency anemia",
        "iron-deficiency anemia",
        "iron deficiency anaemia",
        "缺铁性贫血",
    ),
    Diagnosis.CHRONIC_DISEASE: ("anemia of chronic disease", "anaemia of chronic disease", "慢性病贫血"),
    Diagnosis.THALASSEMIA_TRAIT: ("thalassemia trait", "thalassaemia trait", "地中海贫血"),
    Diagnosis.B12_DEFICIENCY: ("B12 deficiency", "vitamin B12 deficiency", "维生素B12缺乏"),
    Diagnosis.FOLATE_DEFICIENCY: ("folate deficiency", "folic acid deficiency", "叶酸缺乏"),
}
"""Ways to name each diagnosis in a message (English first, then Chinese); the first is the display name."""

CHRONIC_CONDITIONS: Final = ("rheumatoid arthritis", "chronic kidney disease", "Crohn's disease")


def flag(name: str, value: float) -> str | None:
    """`L` below the reference interval, `H` above it, None inside.

    >>> flag("ferritin", 8.0), flag("crp", 40.0), flag("hb", 13.0)
    ('L', 'H', None)
    """
    low, high = REFERENCE[name]
    return "L" if value < low else "H" if value > high else None


def size_class(mcv: float) -> str:
    """The red-cell size class that picks the guideline: microcytic, normocytic or macrocytic.

    >>> size_class(72.0), size_class(85.0), size_class(108.0)
    ('microcytic', 'normocytic', 'macrocytic')
    """
    return "microcytic" if mcv < 80.0 else "macrocytic" if mcv > 100.0 else "normocytic"


@dataclass(frozen=True, slots=True)
class Case:
    """One patient with an anemia. Built from (and written to) a task payload."""

    diagnosis: Diagnosis
    patient_id: str
    report_id: str
    age: int
    sex: str
    history: str
    labs: Mapping[str, float] = field(hash=False)

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Case:
        """The case a task payload describes (see `to_payload`)."""
        data = dict(payload)
        return cls(**{**data, "diagnosis": Diagnosis(data["diagnosis"]), "labs": dict(data["labs"])})

    def to_payload(self) -> dict[str, Any]:
        """The case as plain JSON values, for `Task.payload`."""
        return {
            "diagnosis": self.diagnosis.value,
            "patient_id": self.patient_id,
            "report_id": self.report_id,
            "age": self.age,
            "sex": self.sex,
            "history": self.history,
            "labs": dict(self.labs),
        }

    def panel(self, panel: Panel) -> dict[str, float]:
        """The values of one panel."""
        return {name: self.labs[name] for name in PANELS[panel]}

    @property
    def mentzer(self) -> float:
        """The Mentzer index MCV / RBC; below 13 suggests a thalassemia trait."""
        return self.labs["mcv"] / self.labs["rbc"]


def draw_labs(diagnosis: Diagnosis, rng: random.Random) -> dict[str, float]:
    """Every lab value of a patient with `diagnosis`, rounded as a laboratory reports it."""
    ranges = {**_COMMON, **PROFILES[diagnosis]}
    labs = {name: rng.uniform(low, high) for name, (low, high) in sorted(ranges.items())}
    for name in ("hb", "mcv", "mch", "rdw", "crp", "tsat", "hba2", "hbf", "folate"):
        labs[name] = round(labs[name], 1)
    for name in ("wbc", "rbc"):
        labs[name] = round(labs[name], 2)
    for name in ("plt", "ferritin", "serum_iron", "tibc", "b12"):
        labs[name] = float(round(labs[name]))
    return labs
