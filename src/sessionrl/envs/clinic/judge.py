"""Whether a triage episode solved its case: the right diagnosis, on the right evidence, said to the user.

Four criteria (`Outcome.checks`):
- `diagnosis`: the submitted diagnosis is the case's;
- `evidence`: the tests that confirm the case's diagnosis (`tools.REQUIRED`) had results when it was
  submitted;
- `no_risk`: no call raised a risk flag (a diagnosis submitted without its confirming tests);
- `message`: some message to the user names the diagnosis (in English or Chinese, any case).
"""

from __future__ import annotations

from collections.abc import Sequence

from sessionrl.envs.base import Outcome
from sessionrl.envs.clinic.case import NAMES, Diagnosis
from sessionrl.envs.clinic.tools import REQUIRED, Chart


def names(diagnosis: Diagnosis, message: str) -> bool:
    """True when `message` names `diagnosis` in one of its spellings.

    >>> names(Diagnosis.IRON_DEFICIENCY, "诊断为缺铁性贫血。")
    True
    >>> names(Diagnosis.B12_DEFICIENCY, "Folate deficiency")
    False
    """
    text = message.casefold()
    return any(name.casefold() in text for name in NAMES[diagnosis])


def judge(chart: Chart, messages: Sequence[str]) -> Outcome:
    """Judge an episode's chart and the messages sent to the user (see the module doc)."""
    truth = chart.case.diagnosis
    submitted = None if chart.submitted is None else chart.submitted["diagnosis"]
    checks = {
        "diagnosis": submitted == truth.value,
        "evidence": submitted is not None and REQUIRED[truth] <= chart.evidence,
        "no_risk": not chart.risk_flags,
        "message": any(names(truth, message) for message in messages),
    }
    details = [] if checks["diagnosis"] else [f"submitted {submitted}, the case is {truth.value}"]
    missing = sorted(panel.value for panel in REQUIRED[truth] - chart.evidence)
    details += [f"no {', '.join(missing)} result before the diagnosis"] if missing else []
    details += [f"risky: {flag}" for flag in chart.risk_flags]
    details += [] if checks["message"] else [f"no message names {NAMES[truth][0]}"]
    return Outcome(checks=checks, detail="; ".join(details))
