"""The episode plumbing of the simulated domains (orders, clinic): their env and episode base classes.

A simulated domain draws its tasks from a seeded generator, keeps its contracts as YAML files with simulation
profiles, and answers every skill with a tool function over a mutable state object of its own (a `World`, a
`Chart`). `SimulatedEnv` holds the config, the contracts and the tasks; `SimulatedEpisode` holds one task's
state and the simulated skills bound to it. A domain's subclasses add what is its own: its prompt, its expert,
how a task opens a state, its judge and its structured view of the state.

The config and the skill builders live in `orders.simulated`. They are imported where they are used, because
the orders package imports this module while it loads.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from sessionrl.envs.base import Episode, Split, Task
from sessionrl.envs.faults import Faults
from sessionrl.skills import Skill, SkillContract

if TYPE_CHECKING:
    from sessionrl.envs.orders.simulated import DomainConfig

Json = dict[str, Any]
Tool = Callable[..., Json]
"""A domain tool: called with the episode's state and the call's parameters as keywords; gives the output."""


class SimulatedState(Protocol):
    """What the shared plumbing reads of a domain's episode state."""

    calls: list[tuple[str, Json, Json]]
    """Every successful tool call in order, as `(tool, params, output)`."""
    risk_flags: list[str]
    """Risky calls so far, in order."""

    def mask(self) -> dict[str, bool]:
        """Which tools may succeed now, by name."""
        ...

    def state_hash(self) -> str:
        """A digest of everything the tools changed."""
        ...


StateT = TypeVar("StateT", bound=SimulatedState)


class SimulatedEnv:
    """A simulated domain's config, its contracts scaled by the config, and its seeded tasks by split."""

    def __init__(
        self,
        config: DomainConfig | None,
        *,
        contracts_dir: Path,
        generate: Callable[[int, Split, int], Sequence[Task]],
    ) -> None:
        """`generate(seed, split, size)` gives a split's tasks; `contracts_dir` holds the contracts."""
        from sessionrl.envs.orders.simulated import DomainConfig, build_contracts

        self.config = config or DomainConfig()
        self._contracts = build_contracts(contracts_dir, self.config)
        self._tasks = {split: generate(self.config.seed, split, self.config.size(split)) for split in Split}

    def contracts(self) -> Sequence[SkillContract]:
        """The skill contracts, sorted by name."""
        return self._contracts

    def tasks(self, split: Split) -> Sequence[Task]:
        """The tasks of `split` (ids `<domain>-<split>-<index>`)."""
        return self._tasks[split]


class SimulatedEpisode(Episode, Generic[StateT]):
    """One task over its own state, with one simulated skill per contract answering from `tools`.

    Beyond the `Episode` protocol it offers `risk_flags` and `action_mask`; a domain's subclass adds the rest
    of what structured policies need (`features`, `param_bounds`, `bind`, `summary`) and a judge (`outcome`).
    """

    def __init__(
        self,
        contracts: Sequence[SkillContract],
        task: Task,
        state: StateT,
        tools: Mapping[str, Tool],
        *,
        seed: int,
        faults: Faults | None,
    ) -> None:
        """`seed` drives the skills' latencies, transient failures and `faults`."""
        from sessionrl.envs.orders.simulated import simulated_skills

        self._task = task
        self._state = state
        self._tools = tools
        self._skills = simulated_skills(contracts, self._bind, seed=seed, task_id=task.task_id, faults=faults)

    def _bind(self, name: str) -> Callable[[Json], Json]:
        """Skill `name`'s answer: its tool over a copy of the parameters, logged, the output copied out."""
        tool = self._tools[name]

        def run(params: Json) -> Json:
            params = copy.deepcopy(params)
            output = tool(self._state, **params)
            self._state.calls.append((name, params, output))
            return copy.deepcopy(output)

        return run

    @property
    def task(self) -> Task:
        """The task attempted."""
        return self._task

    @property
    def risk_flags(self) -> tuple[str, ...]:
        """Risky calls so far, in order (see the domain's `tools.RISK_FLAGS`)."""
        return tuple(self._state.risk_flags)

    def skills(self) -> Sequence[Skill]:
        """The skills bound to this episode's state, one per contract."""
        return self._skills

    def action_mask(self) -> dict[str, bool]:
        """Which skills may succeed now (their state-dependent preconditions hold), by name."""
        return self._state.mask()

    def state_hash(self) -> str:
        """Digest of the state as the calls left it."""
        return self._state.state_hash()
