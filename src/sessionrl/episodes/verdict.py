"""The end of every episode: one `task_outcome` verdict, and why a judged session is not a solution.

The verdict is a `task_outcome` feedback: score 1.0 when the env's checker says the task is solved, else
0.0; annotator `<env>_checker`; `data` holds the checks by name, the checker's detail in words and its
findings by kind (`Outcome.findings`).

`why_unsolved` reads a stored session and names, in one short code, why it does not count as a solved
episode (a demonstration imitation could learn from):

    unjudged              the session holds no verdict (the run stopped before the episode ended)
    plan_rejected:<code>  a guard refused the plan (`repeated_tool`, `too_many_subgoals`, ...)
    call_failed:<code>    a tool call still failed after its retries (`UNAVAILABLE`, `UNMET_DEPENDENCIES`)
    unsolved:<checks>     every call went through, but the checker's named checks failed
"""

from __future__ import annotations

from sessionrl.envs.base import Outcome
from sessionrl.session.model import CallStatus, Feedback, FeedbackType, Session


def verdict(env: str, outcome: Outcome) -> Feedback:
    """The `task_outcome` feedback that records how the checker of env `env` judged an episode."""
    return Feedback(
        type=FeedbackType.TASK_OUTCOME,
        score=1.0 if outcome.success else 0.0,
        comment=outcome.detail or None,
        annotator=f"{env}_checker",
        data={
            "checks": dict(outcome.checks),
            "detail": outcome.detail,
            "findings": {kind: list(found) for kind, found in outcome.findings.items()},
        },
    )


def task_success(session: Session) -> bool | None:
    """The latest `task_outcome` verdict of a session, or None when it was never judged."""
    verdicts = [f for f in session.feedback if f.type == FeedbackType.TASK_OUTCOME and f.score is not None]
    if not verdicts:
        return None
    latest = max(verdicts, key=lambda f: f.occurred_at)
    return bool(latest.score and latest.score > 0)


def why_unsolved(session: Session) -> str | None:
    """Why `session` is not a solved episode, as a code the module doc lists; None when it is solved."""
    solved = task_success(session)
    if solved is None:
        return "unjudged"
    if solved:
        return None
    rejection = next((f for f in session.feedback if f.type == FeedbackType.PLAN_REJECTION), None)
    if rejection is not None:
        return f"plan_rejected:{rejection.data.get('reason', 'unknown')}"
    last: dict[str, tuple[CallStatus, str | None]] = {}
    for call in session.tool_calls:  # a step called again after a failure counts by its last call
        last[call.subgoal_id or call.tool] = (call.status, call.error_code)
    failed = [code or status.value for status, code in last.values() if status is not CallStatus.SUCCESS]
    if failed:
        return f"call_failed:{failed[0]}"
    outcome = next(f for f in reversed(session.feedback) if f.type == FeedbackType.TASK_OUTCOME)
    checks = outcome.data.get("checks", {})
    return "unsolved:" + (",".join(sorted(name for name, ok in checks.items() if not ok)) or "no_checks")
