"""What the simulated domains (orders, clinic) share: their config, their skills, their env and episode bases.

A simulated domain draws its tasks from a seeded generator, keeps its contracts as YAML files with a
`simulation` profile each, and answers every skill with a tool function over a mutable state object of its
own (a `World`, a `Chart`). Its skills are `simulated_skill`s: a call sleeps a latency drawn from the profile
on the caller's clock, may fail with the profile's rate and a retryable code (before the tool runs, so
nothing changes), and otherwise runs the tool.

`DomainConfig` sets a domain's task counts, its time scale and whether skills fail transiently.
`SimulatedEnv` holds the config, the contracts and the tasks; `SimulatedEpisode` holds one task's state and
the simulated skills bound to it. A domain's subclasses add what is its own: its prompt, its expert, how a
task opens a state, its judge and its structured view of the state.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from sessionrl.envs.base import Episode, Split, Task, stream_seed
from sessionrl.envs.faults import Faults, with_faults
from sessionrl.skills import Skill, SkillContract, load_contracts, simulated_skill

Json = dict[str, Any]
T = TypeVar("T")
Tool = Callable[..., Json]
"""A domain tool: called with the episode's state and the call's parameters as keywords; gives the output."""


@dataclass(frozen=True, slots=True)
class DomainConfig:
    """How a simulated domain is built: its tasks, and how its skills spend time and fail."""

    seed: int = 0
    """Seeds task generation; the same seed gives the same tasks."""
    train: int = 400
    """Number of training tasks."""
    dev: int = 50
    """Number of development tasks."""
    test: int = 100
    """Number of test tasks."""
    time_factor: float = 1.0
    """Multiplies every simulated latency before it is slept on the caller's clock (0: no sleeping)."""
    transient_failures: bool = False
    """Whether skills also fail at their contracts' rates with retryable codes, as real back ends do. Off by
    default, so an episode without `faults` is deterministic and the expert always succeeds."""

    def __post_init__(self) -> None:
        if self.train < 1:
            raise ValueError(
                f"DomainConfig.train must be at least 1 (a domain needs training tasks), got {self.train}"
            )
        for name in ("dev", "test"):
            if getattr(self, name) < 0:
                raise ValueError(f"DomainConfig.{name} must be at least 0, got {getattr(self, name)}")
        if self.time_factor < 0:
            raise ValueError(f"DomainConfig.time_factor must be at least 0, got {self.time_factor}")

    def size(self, split: Split) -> int:
        """How many tasks `split` holds."""
        return {Split.TRAIN: self.train, Split.DEV: self.dev, Split.TEST: self.test}[split]


def build_contracts(folder: Path, config: DomainConfig) -> tuple[SkillContract, ...]:
    """The contracts in `folder`, sorted by name, their simulation profiles scaled by `config`."""
    contracts = []
    for contract in load_contracts(folder).values():
        profile = contract.simulation
        if profile is None:
            raise ValueError(f"{contract.name}: a simulated domain's contract needs a simulation profile")
        scaled = profile.model_copy(
            update={
                "mean_ms": profile.mean_ms * config.time_factor,
                "std_ms": profile.std_ms * config.time_factor,
                "fail_rate": profile.fail_rate if config.transient_failures else 0.0,
            }
        )
        contracts.append(contract.model_copy(update={"simulation": scaled}))
    return tuple(sorted(contracts, key=lambda c: c.name))


def simulated_skills(
    contracts: Sequence[SkillContract],
    run: Callable[[str], Callable[[Json], Json]],
    *,
    seed: int,
    task_id: str,
    faults: Faults | None,
) -> list[Skill]:
    """One simulated skill per contract answering with `run(name)`, wrapped with `faults`.

    Each skill draws latencies and failures from its own stream, named by the seed, the task and the skill.
    """
    skills: list[Skill] = [
        simulated_skill(c, seed=stream_seed(seed, task_id, c.name), output=run(c.name)) for c in contracts
    ]
    return with_faults(skills, faults, seed)


def json_copy(value: T) -> T:
    """A deep copy of `value` that copies plain dicts and lists itself and shares strings, numbers and None
    (immutable); anything else (a tuple, a dict subclass) goes through `copy.deepcopy`.

    >>> data = {"a": [1, {"b": "c"}]}
    >>> copied = json_copy(data)
    >>> copied == data and copied["a"] is not data["a"] and copied["a"][1] is not data["a"][1]
    True
    """
    data: Any = value
    if type(data) is dict:
        return {key: json_copy(item) for key, item in data.items()}  # type: ignore[return-value]
    if type(data) is list:
        return [json_copy(item) for item in data]  # type: ignore[return-value]
    if data is None or isinstance(data, str | int | float):
        return value
    return copy.deepcopy(value)


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
        self._task = task
        self._state = state
        self._tools = tools
        self._skills = simulated_skills(contracts, self._bind, seed=seed, task_id=task.task_id, faults=faults)

    def _bind(self, name: str) -> Callable[[Json], Json]:
        """Skill `name`'s answer: its tool over a copy of the parameters, logged, the output copied out.

        The answer holds the state, not the episode, so an episode and its skills form no reference cycle
        and are freed as soon as the last reference goes (not at the next garbage collection).
        """
        tool, state = self._tools[name], self._state

        def run(params: Json) -> Json:
            params = json_copy(params)
            output = tool(state, **params)
            state.calls.append((name, params, output))
            return json_copy(output)

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
