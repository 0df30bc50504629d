"""Fault injection whose rate follows a schedule, so training can start noisy and end clean.

Three kinds of fault, each drawn independently with its own probability (`Faults`):
- `tool_error`: a tool call fails before it runs (nothing changes) with `UNAVAILABLE` (retryable) and a
  garbled error payload as its message;
- `garbled_output`: a tool call runs (its effects stay), but its answer arrives as mangled JSON text, so the
  call fails with `INVALID_OUTPUT` (not retryable: running it again would repeat the effects);
- `plan_order`: an expert plan arrives with its steps reversed.

`FaultSchedule` turns a training step into a rate, and `Faults.scheduled` turns that rate into per-kind
probabilities. `with_faults` wraps any skills; every draw comes from a seeded `random.Random`, so a seed
reproduces the same faults.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

import orjson

from sessionrl.skills import Clock, ErrorCode, Skill, SkillError
from sessionrl.skills.skill import JsonValue

if TYPE_CHECKING:
    from sessionrl.envs.base import ExpertPlan

_NOISE = ("{", ",", ":", "\\", "[")


class FaultKind(StrEnum):
    """A kind of injected fault."""

    TOOL_ERROR = "tool_error"
    GARBLED_OUTPUT = "garbled_output"
    PLAN_ORDER = "plan_order"


@dataclass(frozen=True, slots=True)
class FaultSchedule:
    """A fault rate that moves from `start` to `end` over `steps` steps, then stays at `end`.

    `shape="linear"` interpolates the rate itself; `shape="exponential"` interpolates its logarithm
    (a constant factor per step), which needs both ends above zero.

    >>> FaultSchedule(start=1.0, end=0.0, steps=4).rate(1)
    0.75
    >>> round(FaultSchedule(start=1.0, end=0.01, steps=2, shape="exponential").rate(1), 6)
    0.1
    """

    start: float = 1.0
    end: float = 0.05
    steps: int = 1000
    shape: Literal["linear", "exponential"] = "linear"

    def __post_init__(self) -> None:
        for name, value in (("start", self.start), ("end", self.end)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"FaultSchedule.{name} must be a probability in [0, 1], got {value}")
        if self.steps < 1:
            raise ValueError(f"FaultSchedule.steps must be at least 1, got {self.steps}")
        if self.shape == "exponential" and min(self.start, self.end) <= 0.0:
            raise ValueError("an exponential FaultSchedule needs start > 0 and end > 0; use shape='linear'")

    def rate(self, step: int) -> float:
        """The fault probability at `step` (steps before 0 count as 0, after `steps` as `steps`)."""
        progress = min(max(step, 0), self.steps) / self.steps
        if self.shape == "linear":
            return self.start + (self.end - self.start) * progress
        return math.exp(math.log(self.start) + (math.log(self.end) - math.log(self.start)) * progress)


@dataclass(frozen=True, slots=True)
class Faults:
    """The probability of each fault kind for one episode (all zero: no faults)."""

    tool_error: float = 0.0
    garbled_output: float = 0.0
    plan_order: float = 0.0

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"Faults.{item.name} must be a probability in [0, 1], got {value}")

    @classmethod
    def scheduled(
        cls, schedule: FaultSchedule, step: int, kinds: frozenset[FaultKind] = frozenset(FaultKind)
    ) -> Faults:
        """Every kind in `kinds` at the schedule's rate for `step`; the other kinds at zero."""
        rate = schedule.rate(step)
        return cls(**{kind.value: rate for kind in kinds})

    @property
    def tool_faults(self) -> bool:
        """True when tool calls may fail or come back garbled."""
        return self.tool_error > 0.0 or self.garbled_output > 0.0


def garble_json(text: str, rng: random.Random) -> str:
    """Mangle a JSON text: cut it at a random point and append a stray JSON token.

    The result never parses as JSON: a proper prefix followed by one of `{ , : \\ [` is always left
    unbalanced, unterminated or malformed.
    """
    cut = rng.randrange(0, max(len(text), 1))
    return text[:cut] + rng.choice(_NOISE)


def inject_plan_faults(plan: ExpertPlan, faults: Faults, rng: random.Random) -> ExpertPlan:
    """With probability `faults.plan_order`, the same plan with its steps in reverse order."""
    if faults.plan_order > 0.0 and rng.random() < faults.plan_order:
        return dataclasses.replace(plan, steps=tuple(reversed(plan.steps)))
    return plan


class FaultySkill(Skill):
    """A skill whose calls fail or come back garbled at the rates of `faults`, drawn from `rng`."""

    def __init__(self, inner: Skill, faults: Faults, rng: random.Random) -> None:
        super().__init__(inner.contract)
        self.inner = inner
        self._faults = faults
        self._rng = rng

    async def invoke(self, params: dict[str, Any], clock: Clock) -> JsonValue:
        """Maybe fail before running; else run the inner skill and maybe garble its answer."""
        if self._rng.random() < self._faults.tool_error:
            payload = orjson.dumps({"error": "service unavailable", "tool": self.name}).decode()
            raise SkillError(ErrorCode.UNAVAILABLE, garble_json(payload, self._rng))
        output = await self.inner.invoke(params, clock)
        if self._rng.random() < self._faults.garbled_output:
            raise SkillError(ErrorCode.INVALID_OUTPUT, garble_json(orjson.dumps(output).decode(), self._rng))
        return output

    async def aclose(self) -> None:
        """Close the inner skill."""
        await self.inner.aclose()


def with_faults(skills: Sequence[Skill], faults: Faults | None, seed: int) -> list[Skill]:
    """`skills` wrapped to inject tool faults (unchanged when `faults` has none).

    Each skill draws from its own generator seeded by `seed` and its name, so adding or reordering skills
    never changes another skill's faults.
    """
    if faults is None or not faults.tool_faults:
        return list(skills)
    return [FaultySkill(skill, faults, random.Random(f"{seed}:{skill.name}")) for skill in skills]
