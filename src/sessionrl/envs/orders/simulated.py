"""What the simulated domains (orders, clinic) share: their config, their contracts' profiles, their skills.

A simulated domain keeps its contracts as YAML files with a `simulation` profile each. Its skills are
`simulated_skill`s whose answers come from a tool function over the episode's state: a call sleeps a
latency drawn from the profile on the caller's clock, may fail with the profile's rate and a retryable
code (before the tool runs, so nothing changes), and otherwise runs the tool.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionrl.envs.base import Split
from sessionrl.envs.faults import Faults, with_faults
from sessionrl.skills import Skill, SkillContract, load_contracts, simulated_skill

Json = dict[str, Any]


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


def stream_seed(*parts: object) -> int:
    """A 32-bit seed for the random stream named by `parts`.

    >>> stream_seed(0, "orders-train-0000", "sms_send") == stream_seed(0, "orders-train-0000", "sms_send")
    True
    """
    return zlib.crc32(":".join(map(str, parts)).encode())


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
