"""Capability levels L1–L5: one measurable check each, read from stored sessions, passed against a threshold.

    L1 execution    tool-call success over all calls, with at least `l1_min_tools` kinds of tool called
    L2 perception   sessions that read the request's structured fields right: every entity the request
                    names reaches a tool, and no call failed because a field was misread (`*_NOT_FOUND`,
                    bad parameters, unknown recipient, wrong code)
    L3 planning     sessions of tasks of `l3_min_steps` or more steps whose decomposition is right: the
                    recorded plan (if any) is a valid DAG the guards accepted, and the checker's `pattern`
                    check (or, without one, the task's success) holds
    L4 memory       entities the request does not name (an earlier turn's order, waybill, ...) that the
                    session still passed to a tool; forgetting is the share it did not
    L5 reflection   success of retries with a reflection in context minus success of retries without it
                    (sessions marked `metadata.retry_of`, with `metadata.reflected` true or false)

A level with no session to judge it is *unmeasured* (`passed` None), neither passed nor failed. Levels
build on each other: `LevelReport.reached` is the highest level whose own and lower checks all passed.
The thresholds (`LevelsConfig`) default to the seed's values; a run config may change them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from sessionrl.episodes.verdict import task_success
from sessionrl.eval.metrics import success_rate
from sessionrl.session import CallStatus, FeedbackType, Plan, Session


class Level(StrEnum):
    """The five capability levels, lowest first."""

    L1 = "L1"
    L2 = "L2"
    L3 = "L3"
    L4 = "L4"
    L5 = "L5"


NAMES: Mapping[Level, str] = {
    Level.L1: "execution",
    Level.L2: "perception",
    Level.L3: "planning",
    Level.L4: "memory",
    Level.L5: "reflection",
}

MISREAD_CODES = frozenset({"INVALID_PARAMS", "INVALID_ARGUMENT", "UNKNOWN_RECIPIENT", "INVALID_CODE"})
"""Error codes that say a call's parameters misread the request (besides every `*_NOT_FOUND` code)."""


class LevelsConfig(BaseModel):
    """Thresholds of the five levels (the seed's defaults), and which levels gate reinforcement learning."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    l1_tcsr: float = Field(default=0.992, ge=0, le=1, description="L1: tool-call success at least this.")
    l1_min_tools: int = Field(default=3, ge=1, description="L1: over at least this many kinds of tool.")
    l2_perception: float = Field(default=0.92, ge=0, le=1, description="L2: inputs read right, share.")
    l3_decomposition: float = Field(default=0.85, ge=0, le=1, description="L3: long tasks decomposed right.")
    l3_min_steps: int = Field(default=5, ge=1, description="L3: a task this many steps long or more.")
    l4_max_forgetting: float = Field(default=0.05, ge=0, le=1, description="L4: remembered entities lost.")
    l4_window: int = Field(default=10, ge=1, description="L4: only reuse within this many turns counts.")
    l5_uplift: float = Field(default=0.40, ge=-1, le=1, description="L5: success gained by reflection.")
    gate: tuple[Level, ...] = Field(
        default=(), description="Levels the imitation policy must pass before RL starts (the seed: L1, L2)."
    )


@dataclass(frozen=True, slots=True)
class LevelResult:
    """One level's measurement: the value, its threshold, whether it passed (None: unmeasured)."""

    level: Level
    value: float | None
    threshold: float
    passed: bool | None
    n: int
    """How many calls (L1), sessions (L2, L3), entities (L4) or retries (L5) the value rests on."""
    detail: str = ""

    @property
    def name(self) -> str:
        """The level's name (`execution`, `perception`, ...)."""
        return NAMES[self.level]


@dataclass(frozen=True, slots=True)
class LevelReport:
    """The five levels of one set of sessions."""

    results: tuple[LevelResult, ...]

    def __getitem__(self, level: Level) -> LevelResult:
        return next(r for r in self.results if r.level is level)

    def passed(self, levels: Iterable[Level]) -> bool:
        """True when every level of `levels` was measured and passed."""
        return all(self[level].passed is True for level in levels)

    @property
    def reached(self) -> Level | None:
        """The highest level whose check and every lower one passed (None when L1 did not)."""
        top = None
        for result in sorted(self.results, key=lambda r: r.level):
            if result.passed is not True:
                break
            top = result.level
        return top

    def as_dict(self) -> dict[str, object]:
        """A JSON-friendly view keyed by level."""
        out: dict[str, object] = {
            r.level.value: {
                "name": r.name,
                "value": r.value,
                "threshold": r.threshold,
                "passed": r.passed,
                "n": r.n,
                "detail": r.detail,
            }
            for r in self.results
        }
        out["reached"] = self.reached.value if self.reached else None
        return out


StepsOf = Callable[[Session], int | None]
"""How many steps a session's task needs (None: unknown); L3 falls back to the session's plan length."""


def _result(
    level: Level, value: float | None, threshold: float, n: int, ok: bool, detail: str
) -> LevelResult:
    return LevelResult(level, value, threshold, None if value is None else ok, n, detail)


def execution(sessions: Sequence[Session], config: LevelsConfig) -> LevelResult:
    """L1: tool-call success over every call, and how many kinds of tool were called."""
    calls = [c for s in sessions for c in s.tool_calls]
    kinds = len({c.tool for c in calls})
    if not calls:  # an agent that never acts has not shown it can
        return LevelResult(Level.L1, 0.0, config.l1_tcsr, False, 0, "no tool call")
    rate = sum(c.status == CallStatus.SUCCESS for c in calls) / len(calls)
    ok = rate >= config.l1_tcsr and kinds >= config.l1_min_tools
    return _result(Level.L1, rate, config.l1_tcsr, len(calls), ok, f"{kinds} kinds of tool")


def misread(code: str | None) -> bool:
    """Whether an error code says a parameter misread the request.

    >>> misread("ORDER_NOT_FOUND"), misread("UNAVAILABLE"), misread(None)
    (True, False, False)
    """
    return code is not None and (code.endswith("NOT_FOUND") or code in MISREAD_CODES)


def read_right(session: Session) -> bool | None:
    """Whether a session read its request's structured fields right (None: the request names none)."""
    named = [e for e in _expected(session) if e in session.user_query]
    if not named:
        return None
    used = _params_text(session, len(session.tool_calls))
    return all(e in used for e in named) and not any(misread(c.error_code) for c in session.tool_calls)


def perception(sessions: Sequence[Session], config: LevelsConfig) -> LevelResult:
    """L2: share of the sessions naming entities that read every one right (`read_right`)."""
    verdicts = [v for s in sessions if (v := read_right(s)) is not None]
    if not verdicts:
        return _result(Level.L2, None, config.l2_perception, 0, False, "no request names an entity")
    rate = sum(verdicts) / len(verdicts)
    return _result(Level.L2, rate, config.l2_perception, len(verdicts), rate >= config.l2_perception, "")


def dag_faults(plan: Plan) -> dict[str, list[str]]:
    """What breaks a plan's DAG: dependencies on unknown sub-goals, repeated ids, and sub-goals on a cycle.

    >>> from sessionrl.session import SubGoal
    >>> a = SubGoal(id="a", description="", depends_on=("b",))
    >>> b = SubGoal(id="b", description="", depends_on=("a",))
    >>> dag_faults(Plan(root_goal="g", subgoals=(a, b)))
    {'missing_dependency': [], 'duplicate_id': [], 'cycle': ['a', 'b']}
    """
    ids = [g.id for g in plan.subgoals]
    known = set(ids)
    missing = [f"{g.id}->{d}" for g in plan.subgoals for d in g.depends_on if d not in known]
    duplicate = sorted({i for i in ids if ids.count(i) > 1})
    deps = {g.id: {d for d in g.depends_on if d in known} for g in plan.subgoals}
    while True:  # peel off sub-goals whose dependencies are all done; what is left lies on or after a cycle
        free = [g for g, d in deps.items() if not d]
        if not free:
            break
        for g in free:
            del deps[g]
        for d in deps.values():
            d.difference_update(free)
    return {"missing_dependency": missing, "duplicate_id": duplicate, "cycle": sorted(deps)}


def decomposed_right(session: Session) -> bool:
    """Whether a session decomposed its task right: no plan refused, a valid DAG if it planned, and the
    checker's `pattern` check (the task's success when the checker has none)."""
    if any(f.type == FeedbackType.PLAN_REJECTION for f in session.feedback):
        return False
    if session.plan is not None and any(dag_faults(session.plan).values()):
        return False
    verdicts = [f for f in session.feedback if f.type == FeedbackType.TASK_OUTCOME]
    checks = verdicts[-1].data.get("checks", {}) if verdicts else {}
    if isinstance(checks, dict) and "pattern" in checks:
        return bool(checks["pattern"])
    return task_success(session) is True


def planning(
    sessions: Sequence[Session], config: LevelsConfig, steps_of: StepsOf | None = None
) -> LevelResult:
    """L3: share of the sessions of long tasks (`l3_min_steps` steps or more) decomposed right."""
    long = [s for s in sessions if (_steps(s, steps_of) or 0) >= config.l3_min_steps]
    if not long:
        return _result(Level.L3, None, config.l3_decomposition, 0, False, "no long task")
    rate = sum(decomposed_right(s) for s in long) / len(long)
    return _result(Level.L3, rate, config.l3_decomposition, len(long), rate >= config.l3_decomposition, "")


def remembered(session: Session) -> list[str]:
    """Entities a correct solution uses that the request does not name: they must come from memory."""
    return [e for e in _expected(session) if e not in session.user_query]


def memory_retention(sessions: Sequence[Session], config: LevelsConfig) -> LevelResult:
    """L4: forgetting, the share of remembered entities (`remembered`) no tool call used, over the sessions
    whose earlier turn is at most `l4_window` turns back (`metadata.turn_gap`, 1 when unset)."""
    due = used = 0
    for s in sessions:
        if int(s.metadata.get("turn_gap", 1)) > config.l4_window:
            continue
        wanted = remembered(s)
        text = _params_text(s, len(s.tool_calls))
        due += len(wanted)
        used += sum(e in text for e in wanted)
    if not due:
        return _result(Level.L4, None, config.l4_max_forgetting, 0, False, "no entity to remember")
    forgetting = 1 - used / due
    ok = forgetting <= config.l4_max_forgetting
    return _result(Level.L4, forgetting, config.l4_max_forgetting, due, ok, "value is forgetting (≤ passes)")


def reflection_uplift(sessions: Sequence[Session], config: LevelsConfig) -> LevelResult:
    """L5: success of retries with a reflection minus success of retries without one."""
    retries = [s for s in sessions if "retry_of" in s.metadata]
    with_ = [s for s in retries if s.metadata.get("reflected") is True]
    without = [s for s in retries if s.metadata.get("reflected") is False]
    if not with_ or not without:
        return _result(Level.L5, None, config.l5_uplift, len(retries), False, "no paired retries")
    uplift = success_rate(with_) - success_rate(without)
    detail = f"{len(with_)} retries with reflection, {len(without)} without"
    return _result(Level.L5, uplift, config.l5_uplift, len(retries), uplift >= config.l5_uplift, detail)


def assess(
    sessions: Sequence[Session], config: LevelsConfig | None = None, *, steps_of: StepsOf | None = None
) -> LevelReport:
    """The five levels of `sessions` (see the module doc)."""
    config = config or LevelsConfig()
    return LevelReport(
        (
            execution(sessions, config),
            perception(sessions, config),
            planning(sessions, config, steps_of),
            memory_retention(sessions, config),
            reflection_uplift(sessions, config),
        )
    )


def _expected(session: Session) -> list[str]:
    return [str(e) for e in session.metadata.get("expected_entities", [])]


def _params_text(session: Session, n: int) -> str:
    return " ".join(json.dumps(c.params, sort_keys=True, ensure_ascii=False) for c in session.tool_calls[:n])


def _steps(session: Session, steps_of: StepsOf | None) -> int | None:
    known = steps_of(session) if steps_of is not None else None
    if known is not None:
        return known
    return len(session.plan.subgoals) if session.plan is not None else None


__all__ = [
    "NAMES",
    "Level",
    "LevelReport",
    "LevelResult",
    "LevelsConfig",
    "StepsOf",
    "assess",
    "dag_faults",
    "decomposed_right",
    "execution",
    "memory_retention",
    "misread",
    "perception",
    "planning",
    "read_right",
    "reflection_uplift",
    "remembered",
]
