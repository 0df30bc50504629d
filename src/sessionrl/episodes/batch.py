"""A batch of one agent's episodes on a split's first tasks, run from synchronous code (the CLI, scripts).

Each task gets one episode, seeded by `stream_seed(seed, task_id)`, in a session the store names; the
summary counts the solved tasks and, for the others, the reasons (`why_unsolved`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from sessionrl.envs.base import DecisionEnv, Split, stream_seed
from sessionrl.episodes.config import RolloutConfig
from sessionrl.episodes.driver import Agent, EpisodeSpec, run_episodes
from sessionrl.episodes.progress import progress
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.store import SessionStore


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What a batch gave: how many tasks, how many solved, which failed and why."""

    env: str
    split: Split
    agent: str
    n: int
    successes: int
    failed: tuple[str, ...]
    reasons: Mapping[str, int] = field(default_factory=dict)
    """How many failed episodes each reason (`why_unsolved`) accounts for."""

    @property
    def success_rate(self) -> float:
        """Solved tasks over tasks run (0 when none ran)."""
        return self.successes / self.n if self.n else 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view, the success rate included."""
        return {
            "env": self.env,
            "split": self.split.value,
            "agent": self.agent,
            "n": self.n,
            "successes": self.successes,
            "success_rate": self.success_rate,
            "failed": list(self.failed),
            "reasons": dict(self.reasons),
        }


def run_many(
    env: DecisionEnv,
    split: Split,
    agent: Agent,
    n: int | None = None,
    *,
    store: SessionStore,
    config: RolloutConfig | None = None,
    orchestrator: OrchestratorConfig | None = None,
    seed: int = 0,
    show_progress: bool = True,
) -> RunSummary:
    """Run `agent` on the first `n` tasks of `split` (all with None) into `store`, as `config` says.

    Runs its own event loop, so call it from synchronous code; the progress goes to stderr.
    """
    tasks = list(env.tasks(split))[:n]
    specs = [EpisodeSpec(task, seed=stream_seed(seed, task.task_id)) for task in tasks]
    label = f"{env.name} {split} {agent.name}"
    with progress(Console(stderr=True), label, len(specs), enabled=show_progress) as bar:
        batch = run_episodes(
            env, specs, agent, store, config, orchestrator=orchestrator, done=lambda _: bar.advance()
        )
        ran = asyncio.run(batch)
    failed = tuple(task.task_id for task, r in zip(tasks, ran, strict=True) if not r.success)
    reasons = Counter(r.reason or "unknown" for r in ran if not r.success)
    solved = len(tasks) - len(failed)
    return RunSummary(env.name, split, agent.name, len(tasks), solved, failed, dict(reasons))
