"""Trace distillation: from a solved session, the shortest path of calls that still solves the task.

    drop every call that failed (a failed-then-retried step keeps only the call that went through)
    then, one call at a time from the last, drop each call whose removal keeps every read and still
    verifies by replay
    reads  = where the kept calls' parameters and the final answer, written as a demonstration writes them
             (`sessionrl.policy.references.abstract`: values the request or an earlier result holds become
             references), read a value from the conversation; a removal must leave each of them readable
    replay = the kept calls, in order, on a fresh episode of the same task and seed, each succeeding,
             and the env's checker accepting the session's final message

The reads matter because the replay types the expert's literal values: a lookup whose result a later call
uses (a user id, an order's item ids, a courier) is not needed by the replay, yet a policy imitating the
cut path would have to write a value it never read. A lookup made twice goes (the second's references
read the first's result), and a lookup whose values the request already gives goes (references to the
request come first). The reads are taken against the calls' full outputs, not the cut text a prompt shows.

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

import orjson

from sessionrl.envs.base import DecisionEnv, Split, Task
from sessionrl.policy.references import REFERENCE, Context, abstract
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


def reads(request: str, calls: Sequence[ToolCall], final: str) -> dict[str, str]:
    """Each call's parameters (by call id) and the final answer (key ``""``) as a demonstration writes them
    after `request` and the results of the calls before it, every reference's name blanked: what is left
    says where each action reads a value from the conversation and what it types itself."""
    written: dict[str, str] = {}
    for index, call in enumerate(calls):
        context = Context.of(request, [(c.tool, c.output) for c in calls[:index]])
        written[call.call_id] = _blanked(abstract(call.params, context))
    context = Context.of(request, [(c.tool, c.output) for c in calls])
    written[""] = _blanked(abstract(final, context))
    return written


def _blanked(value: Any) -> str:
    return REFERENCE.sub("{{}}", orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode())


def keeps_reads(request: str, calls: Sequence[ToolCall], final: str, needed: dict[str, str]) -> bool:
    """Whether the path `calls` still reads every value the full path's actions read (`needed`, from
    `reads`): each kept action written the same, a reference standing wherever one stood (it may name
    another result that holds the same value)."""
    return all(needed[key] == written for key, written in reads(request, calls, final).items())


async def shortest_path(env: DecisionEnv, task: Task, session: Session) -> Distilled:
    """`session` cut to its shortest verified path (see the module doc)."""
    seed = int(session.metadata.get("seed", 0))
    final = session.final_output.text if session.final_output is not None else ""
    calls = [c for c in session.tool_calls if c.status == CallStatus.SUCCESS]
    if not await replays(env, task, calls, final, seed):
        return Distilled(session, len(session.tool_calls), verified=False)
    needed = reads(session.user_query, calls, final)
    for index in reversed(range(len(calls))):
        shorter = calls[:index] + calls[index + 1 :]
        if keeps_reads(session.user_query, shorter, final, needed) and await replays(
            env, task, shorter, final, seed
        ):
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


__all__ = ["Distilled", "distill", "keeps_reads", "reads", "replays", "savings", "shortest_path"]
