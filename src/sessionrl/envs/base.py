"""The task-environment protocol: tasks, an episode over fresh domain state, and an expert's plan.

A `DecisionEnv` is a domain (a shop, a fulfilment back office, a clinic). It names its skill contracts, hands
out tasks by split, opens an `Episode` per task and can write an expert demonstration of a task as an
`ExpertPlan`. An episode owns its own copy of the domain state: the skills it returns act on that copy only,
and it judges at the end whether the task was solved.

The shapes follow Gymnasium's core: keyword-only options, one frozen result type (`Outcome`), and
`terminated` (the domain ended the task) kept apart from anything the caller decides.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Protocol, runtime_checkable

from sessionrl.envs.faults import Faults
from sessionrl.skills import Skill, SkillContract


def stream_seed(*parts: object, bits: int = 32) -> int:
    """A `bits`-bit seed for the random stream named by `parts`: the same name gives the same seed in
    every process, and names that differ in any part give independent streams.

    >>> stream_seed(0, "orders-train-0000", "sms_send") == stream_seed(0, "orders-train-0000", "sms_send")
    True
    >>> stream_seed(0, "retail-train-1") == stream_seed(1, "retail-train-1")
    False
    >>> stream_seed(0, "eval", bits=31) < 2**31
    True
    """
    if not 1 <= bits <= 32:
        raise ValueError(f"bits must be between 1 and 32, got {bits}")
    return zlib.crc32(":".join(map(str, parts)).encode()) & ((1 << bits) - 1)


class Split(StrEnum):
    """Which part of a domain's tasks: fitted on, tuned on, or reported on."""

    TRAIN = "train"
    DEV = "dev"
    TEST = "test"


@dataclass(frozen=True, slots=True)
class Task:
    """One request a user brings to the domain.

    `payload` holds what the environment needs to judge and demonstrate the task (for retail: the user id,
    the gold actions and the expected output strings). Treat it as read-only.
    """

    task_id: str
    split: Split
    instruction: str
    payload: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True, slots=True)
class ExpertStep:
    """One sub-goal of an expert plan, solved by one tool call."""

    id: str
    description: str
    tool: str
    params: Mapping[str, Any]
    depends_on: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ExpertPlan:
    """An expert's demonstration of a task: a plan of tool steps, then the final message to the user.

    A caller replays it by sending the plan, one tool call per step in order, then `final_message`.
    """

    goal: str
    steps: tuple[ExpertStep, ...]
    final_message: str

    @property
    def step_ids(self) -> tuple[str, ...]:
        """The ids of the steps, in order."""
        return tuple(step.id for step in self.steps)


EXTRA_CALLS: Final = "extra_calls"
"""`Outcome.findings` kind: tools the episode called that the task did not ask for."""
RISKY: Final = "risky"
"""`Outcome.findings` kind: the risks the episode took (a refund before the return was confirmed)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an episode ended, criterion by criterion.

    `checks` names each criterion of success (for retail: `state` and `outputs`); the task is solved when
    there is at least one and all of them hold. `detail` says in words what failed, for people; `findings`
    says it for programs (reflection reads it), by kind: `EXTRA_CALLS` (tools called that the task did not
    ask for) and `RISKY` (names of risks taken), each with what was found, in order.
    """

    checks: Mapping[str, bool]
    detail: str = ""
    findings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def success(self) -> bool:
        """True when every criterion holds."""
        return bool(self.checks) and all(self.checks.values())


class Episode(Protocol):
    """One attempt at one task, over a fresh copy of the domain state.

    Implementations subclass this protocol explicitly to inherit `success`.
    """

    @property
    def task(self) -> Task:
        """The task this episode attempts."""
        ...

    @property
    def terminated(self) -> bool:
        """True once the domain itself ended the task (for example, a hand-off to a human)."""
        ...

    def skills(self) -> Sequence[Skill]:
        """The domain's skills, bound to this episode's state (one per contract of the environment)."""
        ...

    def state_hash(self) -> str:
        """A canonical digest of this episode's domain state; equal states give equal digests."""
        ...

    def outcome(self, messages_to_user: Sequence[str]) -> Outcome:
        """Judge the episode from its current state and the messages sent to the user."""
        ...

    def success(self, messages_to_user: Sequence[str]) -> bool:
        """True when the task is solved (see `outcome`)."""
        return self.outcome(messages_to_user).success


class DecisionEnv(Protocol):
    """A task domain: its policy text, skill contracts, tasks, episodes and expert."""

    @property
    def name(self) -> str:
        """A short identifier of the domain, such as `retail`."""
        ...

    def system_prompt(self) -> str:
        """The domain policy the agent is given."""
        ...

    def contracts(self) -> Sequence[SkillContract]:
        """The contracts of every skill the domain offers."""
        ...

    def tasks(self, split: Split) -> Sequence[Task]:
        """The tasks of one split, in a stable order."""
        ...

    def episode(self, task: Task, *, seed: int = 0, faults: Faults | None = None) -> Episode:
        """Open an episode on a fresh copy of the state; `faults` (seeded by `seed`) wraps its skills."""
        ...

    def expert(self, task: Task) -> ExpertPlan:
        """A plan that solves `task` when replayed on a fresh episode."""
        ...


class ErrorKind(StrEnum):
    """What a skill's error code says about the call that got it, for programs that reason about failures
    (the reflection extractor). An environment declares its codes' kinds with `ClassifiesErrors`."""

    PRECONDITION = "precondition"
    """The call came before what it needs (a refund before the stock check, an unverified address change)."""
    PARAMETER = "parameter"
    """A value the call passed was wrong (an amount over what is left to refund, a package too small)."""


@runtime_checkable
class ClassifiesErrors(Protocol):
    """An environment that says what its skills' error codes mean; a code it does not name has no kind."""

    @property
    def error_kinds(self) -> Mapping[str, ErrorKind]:
        """The kind of each error code the domain's skills raise, by code."""
        ...


def error_kinds(env: object) -> Mapping[str, ErrorKind]:
    """`env`'s error kinds (see `ClassifiesErrors`), or none when it declares none."""
    return env.error_kinds if isinstance(env, ClassifiesErrors) else {}


@runtime_checkable
class NamesEntities(Protocol):
    """An environment that says which entities a correct solution of a task must use (for ER@5)."""

    def expected_entities(self, task: Task) -> Sequence[str]:
        """Ids or values a solution's tool calls must mention."""
        ...


def entities_named(task: Task, plan: ExpertPlan) -> list[str]:
    """String parameters of `plan` that the task's request names word for word (order numbers, SKUs,
    phones, waybills, addresses), in plan order, each once: the entities a correct solution uses, for an
    environment that does not say (`NamesEntities`).

    >>> task = Task("t", Split.TRAIN, "Where is order #W42? My phone is 555-0100.")
    >>> steps = (ExpertStep("a", "", "get_order", {"order_id": "#W42", "note": "x"}),)
    >>> entities_named(task, ExpertPlan("g", steps, "done"))
    ['#W42']
    """
    values = [v for step in plan.steps for v in step.params.values() if isinstance(v, str)]
    named = (v for v in values if re.search(rf"(?<!\w){re.escape(v)}(?!\w)", task.instruction))
    return list(dict.fromkeys(named))


@runtime_checkable
class GoldPlans(Protocol):
    """An environment whose tasks carry gold actions (τ-bench style), replayable as a plan."""

    def gold_plan(self, task: Task) -> ExpertPlan:
        """The task's gold actions as a plan, ending with a message that says every expected output."""
        ...
