"""The offline reflection extractor: a failed session (and, when the judge has it, the expert's plan) in, a
reflection record out. Rules, first match wins:

1. a call failed and no later call of that tool succeeded: `wrong_order` when its error says a
   precondition was unmet, `bad_parameter` when it says a value was wrong, else `ignored_error`. What an
   error code says comes from the environment (`kinds`: `sessionrl.envs.base.error_kinds(env)`), beside
   the engine's own codes (`UNMET_DEPENDENCIES`) and the codes of a misread request
   (`sessionrl.eval.levels.misread`);
2. with the expert's plan, the first expert step no successful call matched: `bad_parameter` when its
   tool was called with other values, `wrong_order` when it was called before its dependencies, else
   `missing_step`;
3. the checker's findings name a risk taken (a refund before the return was confirmed): `wrong_order`;
4. its findings name a call the task did not ask for: `wrong_tool`;
5. every call matched but the reply failed its check: `hallucinated_result`;
6. otherwise `missing_step`.

The hypothesis names the check it expects the retry to pass; the plan is the fewest steps that fix the
cause, with the expert's values when the judge knows them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from sessionrl.envs.base import EXTRA_CALLS, RISKY, ErrorKind, ExpertPlan, ExpertStep
from sessionrl.episodes.verdict import task_success
from sessionrl.eval.levels import misread
from sessionrl.reflection.record import Reflection, RootCause
from sessionrl.session import CallStatus, FeedbackType, Session, ToolCall
from sessionrl.wire import Refusal

ENGINE_KINDS: Final[Mapping[str, ErrorKind]] = {Refusal.UNMET_DEPENDENCIES: ErrorKind.PRECONDITION}
"""The kinds of the engine's own error codes, whatever the environment."""


def reflect(
    session: Session, expert: ExpertPlan | None = None, kinds: Mapping[str, ErrorKind] | None = None
) -> Reflection | None:
    """The reflection on a failed `session` (None when it did not fail); see the module doc. `kinds` says
    what the environment's error codes mean (`sessionrl.envs.base.error_kinds(env)`)."""
    if task_success(session) is not False:
        return None
    checks, findings = _verdict(session)
    steps = {step.tool: step for step in expert.steps} if expert is not None else {}
    failed = _unresolved(session.tool_calls)
    if failed is not None:
        kind = {**ENGINE_KINDS, **(kinds or {})}.get(failed.error_code or "")
        return _failed_call(session, failed, kind, steps.get(failed.tool), expert)
    if expert is not None:
        found = _unmatched_step(session, expert)
        if found is not None:
            return found
    if findings.get(RISKY):
        risk = findings[RISKY][0]
        hypothesis = f"Confirming first what {risk} skipped makes the `no_risk` check pass."
        return Reflection(session.session_id, RootCause.WRONG_ORDER, hypothesis, _in_order(expert), "no_risk")
    if findings.get(EXTRA_CALLS):
        extra = findings[EXTRA_CALLS][0]
        hypothesis = f"Leaving out the {extra} call makes the `no_extra_actions` check pass."
        plan = (f"do not call {extra}", *_in_order(expert))
        return Reflection(session.session_id, RootCause.WRONG_TOOL, hypothesis, plan, "no_extra_actions")
    if checks.get("message") is False:
        reply = expert.final_message if expert is not None else "what the calls returned"
        hypothesis = "Stating only what the calls returned makes the `message` check pass."
        plan = (f"reply: {reply}",)
        return Reflection(session.session_id, RootCause.HALLUCINATED_RESULT, hypothesis, plan, "message")
    hypothesis = "Making every call the task needs makes the `pattern` check pass."
    return Reflection(session.session_id, RootCause.MISSING_STEP, hypothesis, _in_order(expert), "pattern")


def _verdict(session: Session) -> tuple[dict[str, bool], dict[str, tuple[str, ...]]]:
    """The latest verdict's checks by name and its findings by kind (`Outcome.findings`)."""
    verdicts = [f for f in session.feedback if f.type == FeedbackType.TASK_OUTCOME]
    if not verdicts:
        return {}, {}
    data = verdicts[-1].data
    checks, findings = data.get("checks", {}), data.get("findings", {})
    return (
        {str(k): bool(v) for k, v in checks.items()} if isinstance(checks, dict) else {},
        {str(k): tuple(map(str, v)) for k, v in findings.items()} if isinstance(findings, dict) else {},
    )


def _unresolved(calls: Sequence[ToolCall]) -> ToolCall | None:
    """The first failed call whose tool never succeeded after it."""
    for i, call in enumerate(calls):
        if call.status == CallStatus.SUCCESS:
            continue
        if not any(c.tool == call.tool and c.status == CallStatus.SUCCESS for c in calls[i + 1 :]):
            return call
    return None


def _failed_call(
    session: Session,
    call: ToolCall,
    kind: ErrorKind | None,
    step: ExpertStep | None,
    expert: ExpertPlan | None,
) -> Reflection:
    """The reflection on `call`, which failed for good; `kind` is what its error code says."""
    code = call.error_code or call.status.value
    sid = session.session_id
    if kind is ErrorKind.PRECONDITION:
        needs = _before(step, expert)
        hypothesis = f"Calling {', '.join(needs) or 'its prerequisites'} before {call.tool} lets it succeed."
        plan = (*(f"call {tool} first" for tool in needs), _call_text(call.tool, step, call))
        return Reflection(sid, RootCause.WRONG_ORDER, hypothesis, plan, "pattern", call.call_id)
    if kind is ErrorKind.PARAMETER or misread(code):
        hypothesis = f"Calling {call.tool} with the values the request and earlier results give fixes {code}."
        plan = (_call_text(call.tool, step, call),)
        return Reflection(sid, RootCause.BAD_PARAMETER, hypothesis, plan, "pattern", call.call_id)
    hypothesis = f"Calling {call.tool} again after its {code} error, before going on, makes it succeed."
    plan = (f"call {call.tool} again with the same parameters", "then finish the remaining steps")
    return Reflection(sid, RootCause.IGNORED_ERROR, hypothesis, plan, "pattern", call.call_id)


def _unmatched_step(session: Session, expert: ExpertPlan) -> Reflection | None:
    """The first expert step no successful call did, reflected on."""
    done = [c for c in session.tool_calls if c.status == CallStatus.SUCCESS]
    position: dict[str, int] = {}
    for step in expert.steps:
        index = next(
            (i for i, c in enumerate(done) if c.tool == step.tool and _same(step.params, c.params)), None
        )
        if index is not None and all(position.get(d, len(done)) < index for d in step.depends_on):
            position[step.id] = index
            continue
        sid = session.session_id
        same_tool = [c for c in done if c.tool == step.tool]
        if index is not None:
            hypothesis = f"Calling {step.tool} after {', '.join(_before(step, expert))} makes `pattern` pass."
            plan = (*(f"call {t} first" for t in _before(step, expert)), _call_text(step.tool, step, None))
            return Reflection(sid, RootCause.WRONG_ORDER, hypothesis, plan, "pattern", done[index].call_id)
        if same_tool:
            wrong = sorted(k for k, v in step.params.items() if not _same(v, same_tool[-1].params.get(k)))
            hypothesis = (
                f"Calling {step.tool} with the right {', '.join(wrong)} makes the `pattern` check pass."
            )
            plan = (_call_text(step.tool, step, None),)
            return Reflection(
                sid, RootCause.BAD_PARAMETER, hypothesis, plan, "pattern", same_tool[-1].call_id
            )
        hypothesis = f"Adding the missing step ({step.description}) makes the `pattern` check pass."
        return Reflection(
            sid, RootCause.MISSING_STEP, hypothesis, (_call_text(step.tool, step, None),), "pattern"
        )
    return None


def _same(want: Any, got: Any) -> bool:
    """Whether a call's value does what the expert's does: numbers within 1%, strings ignoring case and
    spacing, mappings key by key (on the expert's keys)."""
    if isinstance(want, Mapping):
        return isinstance(got, Mapping) and all(_same(v, got.get(k)) for k, v in want.items())
    if isinstance(want, int | float) and not isinstance(want, bool):
        try:
            return abs(float(got) - float(want)) <= 0.01 * max(1.0, abs(float(want)))
        except (TypeError, ValueError):
            return False
    if isinstance(want, str) and isinstance(got, str):
        return " ".join(want.casefold().split()) == " ".join(got.casefold().split())
    return bool(want == got)


def _before(step: ExpertStep | None, expert: ExpertPlan | None) -> list[str]:
    """The tools of the expert steps `step` depends on."""
    if step is None or expert is None:
        return []
    by_id = {s.id: s for s in expert.steps}
    return [by_id[d].tool for d in step.depends_on if d in by_id]


def _call_text(tool: str, step: ExpertStep | None, call: ToolCall | None) -> str:
    if step is not None:
        return f"call {tool} with {orjson.dumps(dict(step.params)).decode()}"
    return f"call {tool} with corrected parameters" if call is not None else f"call {tool}"


def _in_order(expert: ExpertPlan | None) -> tuple[str, ...]:
    if expert is None:
        return ("make the task's calls in an order their preconditions allow",)
    return tuple(_call_text(step.tool, step, None) for step in expert.steps)


__all__ = ["ENGINE_KINDS", "reflect"]
