"""Agent-level metrics computed from Decision Sessions.

Every metric reads only what the sessions themselves recorded, by these conventions:

- `metadata["task_id"]` groups attempts at the same task (pass^k, correction uplift);
- a `task_outcome` feedback item with score 1 or 0 says whether the task was solved;
- `metadata["expected_entities"]` lists the entities a correct solution must use (Entity Recall@5);
- a `plan_rejection` feedback item carries `data["reason"]` (`cycle`, `missing_dependency`, ...).

>>> round(pass_hat_k(n=4, c=2, k=2), 4)
0.1667
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sessionrl.episodes.verdict import task_success
from sessionrl.session import CallStatus, FeedbackType, Session

TIMEOUT_CODES = frozenset({"TIMEOUT", "SANDBOX_TIMEOUT"})
BAD_PARAM_CODES = frozenset({"INVALID_PARAMS", "INVALID_ARGUMENT"})


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Chance that k attempts drawn from n (c of them successful) all succeed: C(c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass^k needs k <= n attempts, got k={k}, n={n}")
    return math.comb(c, k) / math.comb(n, k)


def tool_call_success_rate(sessions: Iterable[Session]) -> float:
    """TCSR: successful tool calls over all tool calls the agent made (refused ones included)."""
    calls = [c for s in sessions for c in s.tool_calls]
    return _ratio(sum(c.status == CallStatus.SUCCESS for c in calls), len(calls))


def dag_validity_rate(sessions: Iterable[Session]) -> float | None:
    """DVR: planned sessions whose plan passed the guards, over all planned sessions; None when no session
    sent a plan (an agent that acts step by step has no DAG to judge)."""
    planned = [s for s in sessions if s.plan is not None or _rejections(s)]
    if not planned:
        return None
    return sum(not _rejections(s) for s in planned) / len(planned)


def entity_recall_at_5(session: Session) -> float | None:
    """ER@5: share of the expected entities that appear in the parameters of the first 5 tool calls."""
    expected = [str(e) for e in session.metadata.get("expected_entities", [])]
    if not expected:
        return None
    used = " ".join(json.dumps(c.params, sort_keys=True) for c in session.tool_calls[:5])
    return sum(e in used for e in expected) / len(expected)


def steps_per_task(sessions: Sequence[Session]) -> float:
    """SPT: mean number of tool and LLM calls per session."""
    return _ratio(sum(len(s.tool_calls) + len(s.llm_calls) for s in sessions), len(sessions))


def correction_uplift(before: Sequence[Session], after: Sequence[Session]) -> float | None:
    """CU: success after minus success before, on the tasks that were corrected before.

    A task counts as corrected when a session of it in `before` failed or received a rating below 4.
    None when no task was corrected or none of those tasks was attempted again.
    """
    corrected = {_task(s) for s in before if task_success(s) is False or _low_rating(s)}
    prior = [s for s in before if _task(s) in corrected]
    later = [s for s in after if _task(s) in corrected]
    if not prior or not later:
        return None
    return success_rate(later) - success_rate(prior)


def success_rate(sessions: Sequence[Session]) -> float:
    """Share of judged sessions whose task was solved (unjudged sessions count as failures)."""
    return _ratio(sum(task_success(s) is True for s in sessions), len(sessions))


def failure_attribution(sessions: Iterable[Session]) -> dict[str, int]:
    """Counts of what went wrong: timeouts vs bad parameters, cycles vs missing deps, hallucinations."""
    counts: Counter[str] = Counter()
    for s in sessions:
        for call in s.tool_calls:
            if call.status == CallStatus.TIMEOUT or call.error_code in TIMEOUT_CODES:
                counts["timeout"] += 1
            elif call.error_code in BAD_PARAM_CODES:
                counts["bad_params"] += 1
            elif call.status == CallStatus.REFUSED:
                counts["refused"] += 1
            elif call.status != CallStatus.SUCCESS:
                counts["tool_error"] += 1
        for reason in _rejections(s):
            counts[
                "cycle"
                if "cycle" in reason
                else "missing_dependency"
                if "missing" in reason
                else "plan_other"
            ] += 1
        counts["hallucination"] += sum(f.type == FeedbackType.HALLUCINATION_PENALTY for f in s.feedback)
    return {k: v for k, v in sorted(counts.items()) if v}


@dataclass(frozen=True, slots=True)
class AgentMetrics:
    """The agent-level metrics of one set of sessions."""

    n_sessions: int
    n_tasks: int
    success: float
    pass_k: dict[int, float]
    tcsr: float
    dvr: float | None
    er5: float | None
    spt: float
    failures: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        """A JSON-friendly view (pass^k keys as `pass^k`)."""
        out: dict[str, object] = {
            "n_sessions": self.n_sessions,
            "n_tasks": self.n_tasks,
            "success": self.success,
            "tcsr": self.tcsr,
            "dvr": self.dvr,
            "er5": self.er5,
            "spt": self.spt,
            "failures": dict(self.failures),
        }
        out |= {f"pass^{k}": v for k, v in self.pass_k.items()}
        return out


def compute(sessions: Sequence[Session], ks: Sequence[int] = (1,)) -> AgentMetrics:
    """Every metric over `sessions`; pass^k for each k no larger than the fewest attempts per task."""
    by_task: dict[str, list[Session]] = defaultdict(list)
    for s in sessions:
        by_task[_task(s)].append(s)
    recalls = [r for s in sessions if (r := entity_recall_at_5(s)) is not None]
    return AgentMetrics(
        n_sessions=len(sessions),
        n_tasks=len(by_task),
        success=success_rate(sessions),
        pass_k=_pass_k(by_task, ks),
        tcsr=tool_call_success_rate(sessions),
        dvr=dag_validity_rate(sessions),
        er5=sum(recalls) / len(recalls) if recalls else None,
        spt=steps_per_task(sessions),
        failures=failure_attribution(sessions),
    )


def _pass_k(by_task: dict[str, list[Session]], ks: Sequence[int]) -> dict[int, float]:
    if not by_task:
        return {}
    fewest = min(len(v) for v in by_task.values())
    out = {}
    for k in (k for k in ks if k <= fewest):
        scores = [pass_hat_k(len(v), sum(task_success(s) is True for s in v), k) for v in by_task.values()]
        out[k] = sum(scores) / len(scores)
    return out


def _task(session: Session) -> str:
    return str(session.metadata.get("task_id", session.session_id))


def _rejections(session: Session) -> list[str]:
    return [str(f.data.get("reason", "")) for f in session.feedback if f.type == FeedbackType.PLAN_REJECTION]


def _low_rating(session: Session) -> bool:
    return any(
        f.type == FeedbackType.HUMAN_RATING and f.score is not None and f.score < 4 for f in session.feedback
    )


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0
