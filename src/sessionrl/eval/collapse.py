"""Collapse: an RL stage destroying the policy it started from, told apart from noise.

A GRPO step that pushes too hard can unlearn what imitation taught within a few iterations: the replies
stop being actions (`{"":{"":...` answered `UNPARSEABLE_ACTION`), tool calls fail, nothing is solved. The
signs show in the stage's own rollouts, so `CollapseWatch` reads one `Health` per iteration and compares it
with the first one, which is the imitation policy's (no update has happened yet):

    success      share of the iteration's episodes that solved their task; unhealthy below
                 `success_ratio` x the imitation policy's
    tcsr         successful tool calls over all tool calls; unhealthy below `tcsr_ratio` x the imitation's
    unparseable  share of replies that were neither a tool call nor an answer; unhealthy above the
                 imitation's plus `unparseable_rise`
    kl           the update's KL (to the reference policy when the run has one, else the approximate KL
                 to the sampling policy); unhealthy above `max_kl`

`patience` unhealthy iterations in a row are a collapse. The last healthy iteration is remembered: its
policy is the one to roll back to. When the weights that played a streak are undone (dev validation brings
back weights it kept before), `restart` ends the streak: the next iterations are another policy's. Rollout
success of a few dozen episodes is noisy, so the rules are ratios of the imitation policy's own figures and
need several iterations in a row; a collapse moves all of them at once and stays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sessionrl.episodes.llm import UNPARSEABLE
from sessionrl.eval.metrics import tool_call_success_rate
from sessionrl.session import FeedbackType, Session


class CollapseConfig(BaseModel):
    """When the RL stage counts as collapsing, and what the loop does then (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=True, description="Watch RL for collapse (false: train on regardless).")
    action: Literal["rollback", "stop"] = Field(
        default="rollback",
        description="rollback: restore the last healthy policy, then stop; stop: stop with the weights as "
        "they are.",
    )
    patience: int = Field(default=3, ge=1, description="Unhealthy iterations in a row that are a collapse.")
    success_ratio: float = Field(
        default=0.5, ge=0, le=1, description="Unhealthy when rollout success < this x the imitation's."
    )
    tcsr_ratio: float = Field(
        default=0.5, ge=0, le=1, description="Unhealthy when rollout TCSR < this x the imitation's."
    )
    unparseable_rise: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="Unhealthy when the share of replies that are no action exceeds the imitation's by this.",
    )
    max_kl: float = Field(
        default=1.0,
        gt=0,
        description="Unhealthy when the update's KL (to the reference, else approx) > this.",
    )


@dataclass(frozen=True, slots=True)
class Health:
    """What one RL iteration's rollouts (and its update) say about the policy."""

    success: float
    """Share of the iteration's episodes that solved their task."""
    unparseable: float
    """Share of the policy's replies that were neither a tool call nor an answer."""
    tcsr: float | None = None
    """Tool-call success rate of the rollouts; None when they made no call."""
    kl: float | None = None
    """KL of the iteration's update (to the reference, else to the sampling policy); None without one."""

    @classmethod
    def of(cls, sessions: Sequence[Session], record: Mapping[str, Any]) -> Health:
        """The health of an iteration from its rollout sessions and its record (`success`, and `kl_ref` or
        `approx_kl` when it updated)."""
        called = any(s.tool_calls for s in sessions)
        return cls(
            success=float(record["success"]),
            unparseable=unparseable_share(sessions),
            tcsr=tool_call_success_rate(sessions) if called else None,
            kl=_kl(record),
        )

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Health:
        """The health an iteration's logged record kept (`as_record` merged into it)."""
        tcsr = record.get("tcsr")
        return cls(
            success=float(record["success"]),
            unparseable=float(record.get("unparseable", 0.0)),
            tcsr=None if tcsr is None else float(tcsr),
            kl=_kl(record),
        )

    def as_record(self) -> dict[str, Any]:
        """The fields an iteration's record lacks (success and KL are there already)."""
        return {"unparseable": self.unparseable, "tcsr": self.tcsr}


def _kl(record: Mapping[str, Any]) -> float | None:
    value = record.get("kl_ref", record.get("approx_kl"))
    return None if value is None else float(value)


def unparseable_share(sessions: Sequence[Session]) -> float:
    """Replies the action parser refused (`UNPARSEABLE_ACTION`) over all policy replies; 0 with none.

    >>> unparseable_share([])
    0.0
    """
    replies = sum(len(s.llm_calls) for s in sessions)
    refused = sum(
        1
        for s in sessions
        for f in s.feedback
        if f.type == FeedbackType.AUTO_VALIDATION and (f.comment or "").startswith(UNPARSEABLE)
    )
    return refused / replies if replies else 0.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """The watch's reading of one iteration."""

    iteration: int
    problems: tuple[str, ...]
    """Why the iteration is unhealthy; empty when it is healthy."""
    collapsed: bool
    """Whether this iteration completes a collapse (`patience` unhealthy ones in a row)."""

    @property
    def healthy(self) -> bool:
        """No rule fired."""
        return not self.problems


@dataclass
class CollapseWatch:
    """Reads one `Health` per iteration (the first is the baseline) and calls a collapse; see the module
    doc."""

    config: CollapseConfig
    baseline: Health | None = None
    """The imitation policy's health: the first iteration observed."""
    streak: list[Verdict] = field(default_factory=list)
    """The unhealthy iterations in a row up to the last one observed."""
    last_good: int | None = None
    """The last healthy iteration (its policy is the one to roll back to); None before any."""

    def observe(self, iteration: int, health: Health) -> Verdict:
        """Judge one iteration; `collapsed` once `patience` unhealthy ones follow each other."""
        if self.baseline is None:
            self.baseline = health
        problems = self.problems(health)
        verdict = Verdict(iteration, problems, collapsed=False)
        if not problems:
            self.streak, self.last_good = [], iteration
            return verdict
        self.streak.append(verdict)
        collapsed = self.config.enabled and len(self.streak) >= self.config.patience
        verdict = Verdict(iteration, problems, collapsed=collapsed)
        self.streak[-1] = verdict
        return verdict

    def restart(self) -> None:
        """End the unhealthy streak: the weights that played it were undone. The baseline and the last
        healthy iteration stay."""
        self.streak = []

    def problems(self, health: Health) -> tuple[str, ...]:
        """What is wrong with `health` against the baseline (empty: healthy)."""
        cfg, base = self.config, self.baseline
        assert base is not None  # set by the first observation
        found = []
        if health.success < cfg.success_ratio * base.success:
            ratio = f"{cfg.success_ratio:g} x imitation's {base.success:.2f}"
            found.append(f"rollout success {health.success:.2f} < {ratio}")
        tcsr = 0.0 if health.tcsr is None else health.tcsr  # no call at all: nothing succeeded
        if base.tcsr is not None and tcsr < cfg.tcsr_ratio * base.tcsr:
            found.append(f"TCSR {tcsr:.2f} < {cfg.tcsr_ratio:g} x imitation's {base.tcsr:.2f}")
        if health.unparseable > base.unparseable + cfg.unparseable_rise:
            found.append(
                f"{health.unparseable:.0%} of replies unparseable (imitation: {base.unparseable:.0%})"
            )
        if health.kl is not None and health.kl > cfg.max_kl:
            found.append(f"KL {health.kl:.3g} > {cfg.max_kl:g}")
        return tuple(found)

    def describe(self) -> str:
        """The streak that made the collapse (or that goes on), one line; it counts iterations from 1, as
        the console does (the records' `iteration` fields count from 0)."""
        first, last = self.streak[0].iteration + 1, self.streak[-1].iteration + 1
        span = f"iteration {first}" if first == last else f"iterations {first}-{last}"
        return f"{span}: " + "; ".join(self.streak[-1].problems)

    @property
    def blind(self) -> tuple[str, ...]:
        """The rules the baseline leaves unable to fire, each with why: a ratio of a figure the imitation
        policy's rollouts put at 0, or a rise above a share with no room left to rise (empty before the
        baseline, and when every rule can fire)."""
        cfg, base = self.config, self.baseline
        if base is None:
            return ()
        found = []
        if cfg.success_ratio > 0 and base.success == 0:
            found.append("rollout success (the baseline solved no task)")
        if cfg.tcsr_ratio > 0 and not base.tcsr:
            found.append("TCSR (no tool call of the baseline went through)")
        if base.unparseable + cfg.unparseable_rise >= 1:
            found.append(
                f"unparseable replies (the baseline's {base.unparseable:.0%} leaves no room for a rise of"
                f" {cfg.unparseable_rise:.0%})"
            )
        return tuple(found)

    @property
    def unsettled(self) -> bool:
        """Whether the last iteration observed was unhealthy and fewer than `patience` in a row were (the
        stage ended before `patience` could tell a collapse from noise). A watch switched off calls no
        collapse, so a longer streak is not unsettled: it is what the rules would have called one."""
        return 0 < len(self.streak) < self.config.patience


__all__ = ["CollapseConfig", "CollapseWatch", "Health", "Verdict", "unparseable_share"]
