"""Seeded triage cases and the clinician's request about each, in English or Chinese.

Split `s` of seed `k` comes from its own random stream (`clinic:k:s`); diagnoses are dealt round-robin and
shuffled, so every split of at least five cases holds every diagnosis.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Final

from sessionrl.envs.base import Split, Task
from sessionrl.envs.clinic.case import CHRONIC_CONDITIONS, Case, Diagnosis, draw_labs

CHRONIC_ZH: Final = dict(zip(CHRONIC_CONDITIONS, ("类风湿关节炎", "慢性肾病", "克罗恩病"), strict=True))

SYMPTOMS: Final[Mapping[Diagnosis, tuple[tuple[str, str], ...]]] = {
    Diagnosis.IRON_DEFICIENCY: (
        ("fatigue and a recent history of black stools", "乏力，近期有黑便"),
        ("tiredness and a craving for ice", "乏力，喜欢嚼冰块"),
        ("breathlessness on stairs and brittle nails", "爬楼气短，指甲易碎"),
    ),
    Diagnosis.CHRONIC_DISEASE: (
        ("fatigue and long-standing {condition}", "乏力，长期患有{condition}"),
        ("low energy for months; known {condition}", "数月来精力差，既往{condition}"),
    ),
    Diagnosis.THALASSEMIA_TRAIT: (
        (
            "mild anemia found at a routine check-up; relatives are anemic too",
            "体检发现轻度贫血，家族中也有人贫血",
        ),
        ("no symptoms, low MCV on a pre-operative blood count", "无症状，术前血常规发现MCV偏低"),
    ),
    Diagnosis.B12_DEFICIENCY: (
        ("numbness in both feet and fatigue after years of a vegan diet", "双足麻木、乏力，多年素食"),
        ("a sore tongue and an unsteady gait", "舌痛，步态不稳"),
    ),
    Diagnosis.FOLATE_DEFICIENCY: (
        ("fatigue, heavy alcohol use and a poor diet", "乏力，长期饮酒，饮食差"),
        ("tiredness and a diet with hardly any vegetables", "乏力，几乎不吃蔬菜"),
    ),
}
"""How each diagnosis presents: (English, Chinese); `{condition}` is the chronic disease."""

TEMPLATES: Final = (
    "{age}-year-old {sex} with {symptom}. Blood count report {report_id} (patient {patient_id}) is attached; "
    "please work up the anemia and submit a diagnosis.",
    "Patient {patient_id}, {sex}, {age}: {symptom}. Hb {hb} g/dL on report {report_id}. What is causing the "
    "anemia?",
    "Please triage report {report_id} for patient {patient_id} ({sex}, {age} years): {symptom}.",
)
TEMPLATE_ZH: Final = (
    "患者 {patient_id}，{sex}，{age}岁，{symptom}。血常规报告 {report_id}，请评估贫血原因并提交诊断。"
)
SEX_ZH: Final = {"female": "女", "male": "男"}


def draw_case(diagnosis: Diagnosis, rng: random.Random) -> tuple[Case, str]:
    """A case with `diagnosis` and the clinician's request about it, drawn from `rng`."""
    english, chinese = rng.choice(SYMPTOMS[diagnosis])
    condition = rng.choice(CHRONIC_CONDITIONS) if diagnosis is Diagnosis.CHRONIC_DISEASE else ""
    case = Case(
        diagnosis=diagnosis,
        patient_id=f"P-{rng.randrange(100_000, 1_000_000)}",
        report_id=f"LAB-{rng.randrange(100_000, 1_000_000)}",
        age=rng.randrange(18, 86),
        sex=rng.choice(("female", "male")),
        history=english.format(condition=condition),
        labs=draw_labs(diagnosis, rng),
    )
    fields = {
        "age": case.age,
        "patient_id": case.patient_id,
        "report_id": case.report_id,
        "hb": case.labs["hb"],
    }
    if rng.random() < 0.25:
        symptom = chinese.format(condition=CHRONIC_ZH.get(condition, ""))
        return case, TEMPLATE_ZH.format(**fields, sex=SEX_ZH[case.sex], symptom=symptom)
    return case, rng.choice(TEMPLATES).format(**fields, sex=case.sex, symptom=case.history)


def generate(seed: int, split: Split, size: int) -> tuple[Task, ...]:
    """`size` cases of `split`, the same for the same seed; ids are `clinic-<split>-<index>`."""
    rng = random.Random(f"clinic:{seed}:{split.value}")
    diagnoses = [list(Diagnosis)[i % len(Diagnosis)] for i in range(size)]
    rng.shuffle(diagnoses)
    tasks = []
    for index, diagnosis in enumerate(diagnoses):
        case, request = draw_case(diagnosis, rng)
        tasks.append(Task(f"clinic-{split.value}-{index:04d}", split, request, case.to_payload()))
    return tuple(tasks)
