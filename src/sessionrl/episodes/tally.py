"""Nothing lost silently: episodes that gave no usable demonstration, counted by reason.

A demonstration is usable when its episode solved its task. Every other requested demonstration is
counted under the reason its session records (`why_unsolved`: `plan_rejected:repeated_tool`,
`call_failed:UNAVAILABLE`, `unsolved:outputs`, ...) or under `no_task` when the split has fewer tasks
than were asked for. A run reports the tally and stops (`MissingDemonstrations`) when more than
`MAX_MISSING` of the requested demonstrations are missing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sessionrl.episodes.driver import Ran
from sessionrl.errors import SessionRLError

MAX_MISSING: Final = 0.05
"""Largest share of the requested demonstrations a run may go without."""

NO_TASK: Final = "no_task"
"""Reason of a demonstration asked for beyond the last task of the split."""


@dataclass(frozen=True, slots=True)
class Tally:
    """Requested demonstrations, how many are usable, and how many of the others went missing why."""

    requested: int
    usable: int
    reasons: Mapping[str, int]

    @classmethod
    def of(cls, requested: int, ran: Sequence[Ran]) -> Tally:
        """The tally of `ran`, the episodes run for `requested` demonstrations (one per task, so fewer
        when the split ran out of tasks).

        >>> Tally.of(4, [Ran("a", True), Ran("b", False, "unsolved:state")]).reasons
        {'unsolved:state': 1, 'no_task': 2}
        """
        reasons = Counter(r.reason or "unknown" for r in ran if not r.success)
        if requested > len(ran):
            reasons[NO_TASK] += requested - len(ran)
        return cls(requested, sum(r.success for r in ran), dict(reasons))

    @property
    def missing(self) -> int:
        """Requested demonstrations that are not usable."""
        return self.requested - self.usable

    @property
    def missing_share(self) -> float:
        """Missing demonstrations over requested ones (0 when none were requested)."""
        return self.missing / self.requested if self.requested else 0.0

    def describe(self) -> str:
        """One sentence: usable of requested, then each reason with its count, most frequent first."""
        text = f"{self.usable} of {self.requested} demonstrations usable"
        if not self.missing:
            return text
        by_count = sorted(self.reasons.items(), key=lambda item: (-item[1], item[0]))
        return f"{text}; {self.missing} missing: " + ", ".join(f"{n} {reason}" for reason, n in by_count)

    def as_record(self) -> dict[str, Any]:
        """The tally as a metrics record: counts, the missing share and one `missing/<reason>` per reason."""
        record: dict[str, Any] = {
            "requested": self.requested,
            "usable": self.usable,
            "missing": self.missing,
            "missing_share": self.missing_share,
        }
        return record | {f"missing/{reason}": n for reason, n in self.reasons.items()}


class MissingDemonstrations(SessionRLError):
    """Too many requested demonstrations are missing for a run to go on; the message says why."""

    def __init__(self, tally: Tally, limit: float = MAX_MISSING) -> None:
        super().__init__(
            f"{tally.describe()}; more than {limit:.0%} of the requested demonstrations are missing, so "
            "the run stops (the reasons are counted in the run's metrics.jsonl)"
        )
        self.tally = tally
        self.limit = limit


def require(tally: Tally, limit: float = MAX_MISSING) -> Tally:
    """`tally` when at most `limit` of its demonstrations are missing; else raise `MissingDemonstrations`."""
    if tally.missing_share > limit:
        raise MissingDemonstrations(tally, limit)
    return tally
