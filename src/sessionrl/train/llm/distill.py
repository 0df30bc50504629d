"""Trace distillation: from a solved session, the shortest path of calls that still solves the task.

    drop every call that failed (a failed-then-retried step keeps only the call that went through)
    then, one call at a time from the last, drop each call whose removal still verifies by replay
    replay = the kept calls, in order, on a fresh episode of the same task and seed, each succeeding,
             and the env's checker accepting the session's final message

What is left is the session with only the kept calls (`Distilled.session`), ready for imitation like any
demonstration (`sessionrl.train.llm.data.demonstration_turns`); `Distilled.saved` counts the calls dropped.
A session whose own calls do not verify on replay (its success depended on something the replay cannot
reproduce) is kept as it was and said so (`verified` False), never silently dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sessionrl.envs.base import DecisionEnv, Split, Task
from sessionrl.session import CallStatus, Session, ToolCall
from sessionrl.skills import ExecutorConfig, ManualClock, SkillExecutor


@dataclass(frozen=True, slots=True)
class Distilled:
    """A session cut to its shortest verified path, and what was cut."""

    session: Session
    original_calls: int
    verified: bool

    @property
    def saved(self) -> int:
        """How many tool calls distillation dropped."""
        return self.original_calls - len(self.session.tool_calls)


async def replays(env: DecisionEnv, task: Task, calls: Sequence[ToolCall], final: str, seed: int) -> bool:
    """Whether `calls`, replayed in order on a fresh episode (seed `seed`, no retries), all succeed and the
    checker accepts `final`."""
    episode = env.episode(task, seed=seed)
    async with SkillExecutor(
        episode.skills(), ExecutorConfig(max_attempts=1), clock=ManualClock()
    ) as executor:
        for call in calls:
            if not (await executor.call(call.tool, dict(call.params))).ok:
                return False
    return episode.outcome([final] if final else []).success


async def shortest_path(env: DecisionEnv, task: Task, session: Session) -> Distilled:
    """`session` cut to its shortest verified path (see the module doc)."""
    seed = int(session.metadata.get("seed", 0))
    final = session.final_output.text if session.final_output is not None else ""
    calls = [c for c in session.tool_calls if c.status == CallStatus.SUCCESS]
    if not await replays(env, task, calls, final, seed):
        return Distilled(session, len(session.tool_calls), verified=False)
    for index in reversed(range(len(calls))):
        shorter = calls[:index] + calls[index + 1 :]
        if await replays(env, task, shorter, final, seed):
            calls = shorter
    kept = session.model_copy(update={"tool_calls": tuple(calls)})
    return Distilled(kept, len(session.tool_calls), verified=True)


def distill(env: DecisionEnv, sessions: Sequence[Session]) -> list[Distilled]:
    """Every session cut to its shortest verified path (tasks found by `metadata.task_id`)."""
    tasks = {t.task_id: t for split in Split for t in env.tasks(split)}

    async def all_of() -> list[Distilled]:
        return [await shortest_path(env, tasks[str(s.metadata["task_id"])], s) for s in sessions]

    return asyncio.run(all_of())


def savings(distilled: Sequence[Distilled]) -> dict[str, Any]:
    """Calls before and after, the share saved, and how many sessions did not verify."""
    before = sum(d.original_calls for d in distilled)
    after = sum(len(d.session.tool_calls) for d in distilled)
    return {
        "sessions": len(distilled),
        "calls_before": before,
        "calls_after": after,
        "saved_share": (before - after) / before if before else 0.0,
        "unverified": sum(not d.verified for d in distilled),
    }


__all__ = ["Distilled", "distill", "replays", "savings", "shortest_path"]
