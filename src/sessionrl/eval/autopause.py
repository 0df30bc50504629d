"""Auto-pause: stop training when a watched metric falls at evaluation after evaluation, and say why.

`AutoPause.observe` takes each evaluation's metrics in turn. Once the watched metric (DVR by default) has
fallen `patience` times in a row (each value strictly below the one before; an evaluation where the metric
is undefined neither counts nor breaks the run), it pauses and writes a diagnostic report,
`pause_report.json`, to its folder. The report attributes the failures of the last evaluation:

    tool_errors        failed tool calls by error code (what lowers TCSR)
    plan_faults        for each failing plan: the guard's reason, and the cycles and broken dependencies
                       found in the plan itself (what lowers DVR)
    reflection_changes for each retry after a reflection: the tools it added and dropped, and the
                       parameters it changed, against the attempt it retried (what moves CU)
    failures           `failure_attribution` counts
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sessionrl.episodes.verdict import task_success
from sessionrl.eval.levels import dag_faults
from sessionrl.eval.metrics import AgentMetrics, failure_attribution
from sessionrl.session import CallStatus, FeedbackType, Session

REPORT = "pause_report.json"


class AutoPauseConfig(BaseModel):
    """Which metric is watched and how many falls in a row pause the run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str = Field(default="dvr", description="A key of `AgentMetrics.as_dict()` (dvr, tcsr, success).")
    patience: int = Field(default=3, ge=1, description="Falls in a row that pause the run.")


@dataclass
class AutoPause:
    """Watches one metric across evaluations (see the module doc); `paused` once it has fallen enough."""

    config: AutoPauseConfig
    folder: Path
    history: list[tuple[str, float]] = field(default_factory=list)
    falls: int = 0
    paused: bool = False

    def observe(self, label: str, metrics: AgentMetrics, sessions: Sequence[Session]) -> bool:
        """Record one evaluation; True when it pauses the run (the report is then written)."""
        value = metrics.as_dict().get(self.config.metric)
        if not isinstance(value, int | float):
            return self.paused
        if self.history and value < self.history[-1][1]:
            self.falls += 1
        else:
            self.falls = 0
        self.history.append((label, float(value)))
        if self.falls >= self.config.patience and not self.paused:
            self.paused = True
            write_report(self.folder / REPORT, diagnose(self.config.metric, self.history, sessions))
        return self.paused


def diagnose(
    metric: str, history: Sequence[tuple[str, float]], sessions: Sequence[Session]
) -> dict[str, Any]:
    """The diagnostic report of a pause (see the module doc), from the last evaluation's sessions."""
    return {
        "metric": metric,
        "history": [{"label": label, "value": value} for label, value in history],
        "tool_errors": tool_errors(sessions),
        "plan_faults": plan_faults(sessions),
        "reflection_changes": reflection_changes(sessions),
        "failures": failure_attribution(sessions),
    }


def tool_errors(sessions: Sequence[Session]) -> dict[str, int]:
    """Failed tool calls by error code (the status when there is no code)."""
    codes = Counter(
        c.error_code or c.status.value
        for s in sessions
        for c in s.tool_calls
        if c.status != CallStatus.SUCCESS
    )
    return dict(codes.most_common())


def plan_faults(sessions: Sequence[Session]) -> list[dict[str, Any]]:
    """Each failing planned session's guard verdict and the faults found in its plan."""
    out = []
    for s in sessions:
        reasons = [str(f.data.get("reason", "")) for f in s.feedback if f.type == FeedbackType.PLAN_REJECTION]
        faults = dag_faults(s.plan) if s.plan is not None else {}
        if reasons or any(faults.values()):
            out.append({"session_id": s.session_id, "rejected": reasons, **faults})
    return out


def reflection_changes(
    sessions: Sequence[Session], originals: Mapping[str, Session] | None = None
) -> list[dict[str, Any]]:
    """For each retry with a reflection among `sessions` whose retried attempt is in `sessions` (or
    `originals`): what the retry did differently, and whether it then succeeded."""
    known = {s.session_id: s for s in sessions} | dict(originals or {})
    out = []
    for retry in sessions:
        before = known.get(str(retry.metadata.get("retry_of")))
        if before is None or retry.metadata.get("reflected") is not True:
            continue
        out.append({"session_id": retry.session_id, "retry_of": before.session_id, **changes(before, retry)})
    return out


def changes(before: Session, after: Session) -> dict[str, Any]:
    """Tools `after` called that `before` did not, tools it dropped, parameters changed on shared tools,
    and the success of each."""
    tools_before = {c.tool: c.params for c in before.tool_calls}
    tools_after = {c.tool: c.params for c in after.tool_calls}
    changed = {
        tool: sorted(k for k in {*params, *tools_before[tool]} if params.get(k) != tools_before[tool].get(k))
        for tool, params in tools_after.items()
        if tool in tools_before and params != tools_before[tool]
    }
    return {
        "added_tools": sorted(tools_after.keys() - tools_before.keys()),
        "dropped_tools": sorted(tools_before.keys() - tools_after.keys()),
        "changed_params": changed,
        "success_before": task_success(before),
        "success_after": task_success(after),
    }


def write_report(path: Path, report: Mapping[str, Any]) -> None:
    """Write a report as indented JSON (its folder is created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")


__all__ = [
    "REPORT",
    "AutoPause",
    "AutoPauseConfig",
    "changes",
    "diagnose",
    "plan_faults",
    "reflection_changes",
    "tool_errors",
    "write_report",
]
