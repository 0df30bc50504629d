"""The reflection record: why an episode failed (from a fixed taxonomy), a hypothesis a retry can verify,
and the smallest plan that corrects it.

A record is written for a failed session by the judge (`sessionrl.reflection.extract.reflect`, the offline
extractor) or by the policy (asked `ROOT_CAUSE_QUESTION`; `parse_root_cause` reads its answer, and
`cause_reflection` makes the record from the cause alone). It goes into the retry's context as text
(`Reflection.as_text`, `with_reflection`), and into the failed session as a `comment` feedback
(`Reflection.as_feedback`), so the store keeps what was concluded and by whom.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from sessionrl.envs.base import Task
from sessionrl.session import Anchor, Feedback, FeedbackType


class RootCause(StrEnum):
    """The fixed taxonomy of why an attempt failed."""

    WRONG_TOOL = "wrong_tool"
    """A tool the task does not call for (an unasked-for refund, shipment or address change)."""
    BAD_PARAMETER = "bad_parameter"
    """The right tool with a wrong value (an id misread, an amount off, a package too small)."""
    WRONG_ORDER = "wrong_order"
    """The right calls in an order the preconditions forbid (a refund before the return was confirmed)."""
    MISSING_STEP = "missing_step"
    """A call the task needs was never made."""
    IGNORED_ERROR = "ignored_error"
    """A call failed and the attempt went on as if it had not."""
    HALLUCINATED_RESULT = "hallucinated_result"
    """The reply states a result no call produced, or leaves out the one it did."""


ANNOTATOR = "reflection"


@dataclass(frozen=True, slots=True)
class Reflection:
    """One failed session's reflection (see the module doc)."""

    session_id: str
    root_cause: RootCause
    hypothesis: str
    """A claim a retry verifies: what, done differently, makes `check` pass (it is said when not yet)."""
    plan: tuple[str, ...]
    """The minimal corrective steps, in order."""
    check: str = ""
    """The checker's check the hypothesis expects to pass on the retry (`pattern`, `message`, ...)."""
    call_id: str | None = None
    """The call the failure is pinned to, when there is one."""
    source: str = "offline"
    """Who reflected: `offline` (the judge's rule-based extractor), `policy`, or a judge backend."""

    def __post_init__(self) -> None:
        if self.check and f"`{self.check}`" not in self.hypothesis:
            claim = self.hypothesis.rstrip(" .,")
            object.__setattr__(self, "hypothesis", f"{claim}, so the `{self.check}` check passes.")

    def as_text(self) -> str:
        """The reflection as the retry reads it."""
        steps = " ".join(f"{i}. {step}" for i, step in enumerate(self.plan, 1))
        return (
            f"Reflection on the last attempt. Root cause: {self.root_cause.value}. "
            f"Hypothesis: {self.hypothesis} Corrective plan: {steps}"
        )

    def as_feedback(self) -> Feedback:
        """A `comment` feedback holding the record, anchored to the failing call when there is one."""
        data: dict[str, Any] = dataclasses.asdict(self)
        data["root_cause"] = self.root_cause.value
        data["plan"] = list(self.plan)
        anchor = Anchor(call_id=self.call_id) if self.call_id else Anchor()
        return Feedback(
            type=FeedbackType.COMMENT,
            comment=self.as_text(),
            annotator=ANNOTATOR,
            anchor=anchor,
            data={"reflection": data},
        )


def with_reflection(task: Task, reflection: Reflection) -> Task:
    """`task` retried with `reflection` in its context: in the user's message, before the request, so the
    request stays where a policy always reads it, last before its reply (a small policy reads a ticket by
    where it sits: with the reflection after it, one that solved some plain retries solved none)."""
    return dataclasses.replace(task, instruction=f"{reflection.as_text()}\n{task.instruction}")


GENERIC_PLANS: Final[Mapping[RootCause, tuple[str, str]]] = {
    RootCause.WRONG_TOOL: ("do not call a tool the request does not ask for", "no_extra_actions"),
    RootCause.BAD_PARAMETER: (
        "call each tool with the values the request and earlier results give",
        "pattern",
    ),
    RootCause.WRONG_ORDER: ("make each call only after the calls it depends on", "pattern"),
    RootCause.MISSING_STEP: ("make every call the request needs before answering", "pattern"),
    RootCause.IGNORED_ERROR: ("call a tool again when it fails, before going on", "pattern"),
    RootCause.HALLUCINATED_RESULT: ("state only what the calls returned", "message"),
}
"""Each cause's corrective step and the check it should make pass, when who reflects knows only the cause."""


def cause_reflection(session_id: str, cause: RootCause, source: str = "policy") -> Reflection:
    """A reflection that knows only its root cause (the policy's own, which names a cause and no more):
    the cause's generic corrective step (`GENERIC_PLANS`).

    >>> cause_reflection("s1", RootCause.IGNORED_ERROR).as_text().split(". Hypothesis")[0]
    'Reflection on the last attempt. Root cause: ignored_error'
    """
    step, check = GENERIC_PLANS[cause]
    hypothesis = f"Correcting the {cause.value.replace('_', ' ')} makes the `{check}` check pass."
    return Reflection(session_id, cause, hypothesis, (step,), check, source=source)


ROOT_CAUSE_QUESTION = "The attempt above failed. What was the root cause?"
"""What a policy is asked after a failed transcript, to reflect itself (and to learn root causes)."""


def root_cause_answer(cause: RootCause) -> str:
    """The answer a policy is trained to give to `ROOT_CAUSE_QUESTION`.

    >>> root_cause_answer(RootCause.BAD_PARAMETER)
    'root cause: bad_parameter'
    """
    return f"root cause: {cause.value}"


_ANSWER = re.compile(r"root cause:\s*([a-z_]+)", re.IGNORECASE)


def parse_root_cause(text: str) -> RootCause | None:
    """The root cause a policy's answer names, or None when it names none of the taxonomy.

    >>> parse_root_cause("Root cause: wrong_order, since..."), parse_root_cause("no idea")
    (<RootCause.WRONG_ORDER: 'wrong_order'>, None)
    """
    found = _ANSWER.search(text)
    if found is None:
        return None
    try:
        return RootCause(found.group(1).lower())
    except ValueError:
        return None


__all__ = [
    "ANNOTATOR",
    "GENERIC_PLANS",
    "ROOT_CAUSE_QUESTION",
    "Reflection",
    "RootCause",
    "cause_reflection",
    "parse_root_cause",
    "root_cause_answer",
    "with_reflection",
]
