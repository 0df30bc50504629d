"""Feedback on finished triage sessions: an automatic lab-consistency validator, and annotators who rate late.

`validate` checks at once that the submitted diagnosis agrees with the lab values the session saw
(`AUTO_VALIDATION`, score 1 or 0). `annotate` asks a panel of simulated clinicians: each reviews a share of
sessions, rates 1–5 and comments in English or Chinese on what the answer missed, hours after the session
ended (`occurred_at`), and their review tool uploads it minutes to hours later (`received_at`). `deliver`
hands the items out as a simulated clock reaches each arrival.

Ratings: 1 no diagnosis, 2 wrong diagnosis, 3 right but without its confirming tests, 4 right but the
answer misses the point a senior would ask for (for iron deficiency: that anemia of chronic disease was
excluded), 5 right and complete; an annotator is one point off now and then.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

from sessionrl.envs.clinic.case import NAMES, Case, Diagnosis, Panel
from sessionrl.envs.clinic.tools import REQUIRED, TEST_PANELS
from sessionrl.session import Anchor, CallStatus, Feedback, FeedbackType, Session, ToolCall
from sessionrl.skills import Clock

VALIDATOR: Final = "lab_consistency"
VALIDATION_LAG: Final = timedelta(seconds=2)
UPLOAD_LAG_S: Final = (60.0, 7200.0)
"""Range of seconds between writing a review and its upload."""
MIN_REVIEW_DELAY: Final = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class Annotator:
    """A simulated clinician who reviews sessions."""

    name: str
    language: Literal["en", "zh"]
    mean_delay_h: float
    """Mean hours from the end of a session to the review (exponentially distributed, at least 5 min)."""
    coverage: float = 1.0
    """Share of sessions this annotator reviews."""
    noise: float = 0.1
    """Probability that the rating is one point off, either way."""


PANEL: Final = (
    Annotator("dr_li", "zh", mean_delay_h=6.0, coverage=1.0, noise=0.1),
    Annotator("dr_okafor", "en", mean_delay_h=20.0, coverage=0.7, noise=0.15),
    Annotator("nurse_chen", "zh", mean_delay_h=2.0, coverage=0.5, noise=0.2),
)
"""The default panel."""


@dataclass(frozen=True, slots=True)
class Element:
    """What a complete answer for a diagnosis mentions, and the comment when it does not."""

    name: str
    keywords: tuple[str, ...]
    en: str
    zh: str


ELEMENTS: Final[Mapping[Diagnosis, Element]] = {
    Diagnosis.IRON_DEFICIENCY: Element(
        "chronic_disease_exclusion",
        ("chronic disease", "慢性病"),
        "Correct diagnosis, but did not mention excluding anemia of chronic disease.",
        "诊断正确，但未提及需排除慢性病贫血。",
    ),
    Diagnosis.CHRONIC_DISEASE: Element(
        "crp_test",
        ("crp", "c-reactive", "c反应蛋白"),
        "Correct diagnosis, but did not mention the raised CRP.",
        "诊断正确，但未提及CRP升高。",
    ),
    Diagnosis.THALASSEMIA_TRAIT: Element(
        "iron_exclusion",
        ("ferritin", "铁蛋白"),
        "Correct diagnosis, but did not mention that a normal ferritin rules out iron deficiency.",
        "诊断正确，但未说明铁蛋白正常、已排除缺铁。",
    ),
    Diagnosis.B12_DEFICIENCY: Element(
        "follow_up_plan",
        ("follow-up", "follow up", "随访", "复查"),
        "Correct diagnosis, but the follow-up plan is missing.",
        "诊断正确，但缺少随访计划。",
    ),
    Diagnosis.FOLATE_DEFICIENCY: Element(
        "b12_check",
        ("b12",),
        "Correct diagnosis, but did not mention that B12 deficiency was excluded before folate.",
        "诊断正确，但未提及补充叶酸前需排除B12缺乏。",
    ),
}

RULES: Final[Mapping[Diagnosis, tuple[str, Callable[[Mapping[str, float]], bool]]]] = {
    Diagnosis.IRON_DEFICIENCY: ("ferritin below 30 ng/mL", lambda v: v.get("ferritin", 1e9) < 30),
    Diagnosis.CHRONIC_DISEASE: (
        "ferritin at least 100 ng/mL and CRP above 10 mg/L",
        lambda v: v.get("ferritin", 0.0) >= 100 and v.get("crp", 0.0) > 10,
    ),
    Diagnosis.THALASSEMIA_TRAIT: ("HbA2 above 3.5%", lambda v: v.get("hba2", 0.0) > 3.5),
    Diagnosis.B12_DEFICIENCY: ("B12 below 200 pg/mL", lambda v: v.get("b12", 1e9) < 200),
    Diagnosis.FOLATE_DEFICIENCY: (
        "folate below 3 ng/mL with B12 at least 200 pg/mL",
        lambda v: v.get("folate", 1e9) < 3 and v.get("b12", 0.0) >= 200,
    ),
}
"""The lab finding each diagnosis needs, in words and as a test over the values seen."""


@dataclass(frozen=True, slots=True)
class Review:
    """An annotator's view of a session before personal noise: a 1–5 score and, when due, a comment."""

    score: int
    missing: str | None = None
    en: str = "Correct and complete."
    zh: str = "诊断正确，考虑全面。"


def _submission(session: Session) -> tuple[int, ToolCall] | None:
    """The first successful diagnosis call and its position."""
    return next(
        (
            (i, call)
            for i, call in enumerate(session.tool_calls)
            if call.tool == "diagnosis_submit" and call.status is CallStatus.SUCCESS
        ),
        None,
    )


def _seen(session: Session, before: int) -> tuple[set[Panel], dict[str, float]]:
    """The test panels and lab values successful calls revealed before position `before`."""
    panels: set[Panel] = set()
    values: dict[str, float] = {}
    for call in session.tool_calls[:before]:
        if call.status is not CallStatus.SUCCESS or not isinstance(call.output, dict):
            continue
        if call.tool in TEST_PANELS:
            panels.add(TEST_PANELS[call.tool])
        values.update(call.output.get("values", {}))
    return panels, values


def review(session: Session, case: Case) -> Review:
    """How a careful senior would rate the session (see the module doc for the scale)."""
    found = _submission(session)
    if found is None:
        return Review(1, "diagnosis", "No diagnosis was submitted.", "未提交诊断。")
    position, call = found
    truth = case.diagnosis
    if call.params.get("diagnosis") != truth.value:
        return Review(
            2,
            "diagnosis",
            f"Wrong diagnosis: the results point to {NAMES[truth][0]}.",
            f"诊断错误，检查结果提示{NAMES[truth][-1]}。",
        )
    panels, _ = _seen(session, position)
    if not REQUIRED[truth] <= panels:
        return Review(
            3,
            "confirming_test",
            "Correct diagnosis, but not confirmed by the needed tests.",
            "诊断正确，但缺少必要的检查依据。",
        )
    text = (session.final_output.text if session.final_output else "").casefold()
    element = ELEMENTS[truth]
    if not any(keyword in text for keyword in element.keywords):
        return Review(4, element.name, element.en, element.zh)
    return Review(5)


def _anchor(session: Session) -> Anchor:
    found = _submission(session)
    return Anchor() if found is None else Anchor(call_id=found[1].call_id)


def annotate(
    session: Session, case: Case, *, seed: int = 0, panel: Sequence[Annotator] = PANEL
) -> tuple[Feedback, ...]:
    """The panel's ratings of a finished session, timed from its end (`session.updated_at`).

    Each annotator draws from a stream named by the seed, the session and the annotator, so a session gets
    the same reviews whatever else is reviewed.
    """
    verdict, anchor, finished = review(session, case), _anchor(session), session.updated_at
    feedback = []
    for annotator in panel:
        rng = random.Random(f"{seed}:{session.session_id}:{annotator.name}")
        if rng.random() >= annotator.coverage:
            continue
        off = rng.choice((-1, 1)) if rng.random() < annotator.noise else 0
        delay = timedelta(hours=rng.expovariate(1.0 / annotator.mean_delay_h))
        written = finished + max(delay, MIN_REVIEW_DELAY)
        feedback.append(
            Feedback(
                feedback_id=f"{session.session_id}:{annotator.name}",
                type=FeedbackType.HUMAN_RATING,
                score=float(min(5, max(1, verdict.score + off))),
                comment=verdict.zh if annotator.language == "zh" else verdict.en,
                annotator=annotator.name,
                anchor=anchor,
                occurred_at=written,
                received_at=written + timedelta(seconds=rng.uniform(*UPLOAD_LAG_S)),
                data={"language": annotator.language, "missing": verdict.missing},
            )
        )
    return tuple(feedback)


def consistent(diagnosis: Diagnosis, values: Mapping[str, float]) -> tuple[bool, str]:
    """Whether lab `values` support `diagnosis`, and the rule applied."""
    rule, test = RULES[diagnosis]
    return test(values), rule


def validate(session: Session) -> tuple[Feedback, ...]:
    """The lab-consistency check of the session's diagnosis, at its end (none without a diagnosis)."""
    found = _submission(session)
    if found is None:
        return ()
    position, call = found
    diagnosis = Diagnosis(call.params["diagnosis"])
    ok, rule = consistent(diagnosis, _seen(session, position)[1])
    finished = session.updated_at
    return (
        Feedback(
            feedback_id=f"{session.session_id}:{VALIDATOR}",
            type=FeedbackType.AUTO_VALIDATION,
            score=1.0 if ok else 0.0,
            annotator=VALIDATOR,
            anchor=Anchor(call_id=call.call_id),
            occurred_at=finished,
            received_at=finished + VALIDATION_LAG,
            data={"diagnosis": diagnosis.value, "rule": rule, "passed": ok},
        ),
    )


def schedule(
    session: Session, case: Case, *, seed: int = 0, panel: Sequence[Annotator] = PANEL
) -> tuple[Feedback, ...]:
    """Every feedback item a finished session will get, validator and annotators, by arrival time."""
    items = (*validate(session), *annotate(session, case, seed=seed, panel=panel))
    return tuple(sorted(items, key=lambda item: (item.received_at, item.feedback_id)))


async def deliver(feedback: Sequence[Feedback], clock: Clock, *, start: datetime) -> AsyncIterator[Feedback]:
    """Yield each item once `clock` reaches its `received_at`, in arrival order.

    The clock's time at the call stands for `start`; the generator sleeps on the clock between arrivals, so
    a `ManualClock` makes days pass at once and a scaled system clock makes them pass quickly.
    """
    origin = clock.now()
    for item in sorted(feedback, key=lambda f: f.received_at):
        wait = (item.received_at - start).total_seconds() - (clock.now() - origin)
        if wait > 0:
            await clock.sleep(wait)
        yield item
