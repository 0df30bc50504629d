"""A scripted agent that knows only what a request says and what memory returns, and two-turn runs.

`RecallingAgent` follows the env's expert plan, but every entity the request does not name (an earlier
turn's order or waybill; `sessionrl.eval.levels.remembered`) is hidden from it. With memory it calls
`memory_search` for the customer and takes, for each hidden entity, the best-ranked remembered entity of
the same shape (`shape`: letters to `A`, digits to `0`, so an order id stands in for an order id); without
memory, or when nothing fits, it writes `unknown`. At the end of each episode it calls `memory_write` with
what it used, so the next turn can find it. Both uses are tool calls in the session.

The same agent with and without memory (`use_memory`) differs only in that access, which makes their
gap on two-turn conversations (`run_conversations`) a measure of what memory is worth.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from sessionrl.envs.base import DecisionEnv, ExpertPlan, Task, stream_seed
from sessionrl.episodes import (
    Attempt,
    EpisodeSpec,
    Ran,
    ScriptedAgent,
    expected_entities,
    guards_for_plans,
    run_episodes,
)
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.policy import PolicyBackend
from sessionrl.orchestrator.results import StepKind, ToolPayload
from sessionrl.session import CallStatus
from sessionrl.store import SessionStore

UNKNOWN = "unknown"


def shape(entity: str) -> str:
    """An entity's shape: each letter `A`, each digit `0`, the rest kept.

    >>> shape("O-843107"), shape("SF8431070000")
    ('A-000000', 'AA0000000000')
    """
    return re.sub(r"\d", "0", re.sub(r"[^\W\d_]", "A", entity))


@dataclass
class RecallingAgent:
    """The expert's plan with hidden entities filled from memory (see the module doc)."""

    env: DecisionEnv
    subject_of: Callable[[Task], str]
    """Whose memory a task reads and writes (the customer)."""
    use_memory: bool = True

    @property
    def name(self) -> str:
        """`recall` with memory, `no-recall` without."""
        return "recall" if self.use_memory else "no-recall"

    @property
    def policy_version(self) -> None:
        """A scripted agent has no policy version."""
        return None

    @property
    def backends(self) -> Sequence[PolicyBackend]:
        """A scripted agent asks no policy."""
        return ()

    def engine_config(self, base: OrchestratorConfig, tasks: Sequence[Task]) -> OrchestratorConfig:
        """`base` with the plan guards widened for the expert's plans."""
        return guards_for_plans(base, (self.env.expert(task) for task in tasks))

    async def act(self, attempt: Attempt) -> str | None:
        """Recall, replay the plan with what is known, then remember what was used."""
        engine, sid, task = attempt.engine, attempt.session_id, attempt.spec.task
        hidden = [e for e in expected_entities(self.env, task) if e not in task.instruction]
        known = await self._recall(attempt, hidden) if hidden else {}
        plan = fill(self.env.expert(task), {e: known.get(e, UNKNOWN) for e in hidden})
        final = await ScriptedAgent(self.name, lambda _: plan).act(attempt)
        if self.use_memory:
            session = await engine.session(sid)
            used = [
                str(v)
                for c in session.tool_calls
                if c.status == CallStatus.SUCCESS
                for v in c.params.values()
            ]
            entities = [e for e in expected_entities(self.env, task) if e in used]
            fact = {"subject": self.subject_of(task), "text": task.instruction, "entities": entities}
            await engine.execute_step(sid, StepKind.TOOL, ToolPayload(tool="memory_write", params=fact))
        return final

    async def _recall(self, attempt: Attempt, hidden: Sequence[str]) -> dict[str, str]:
        """Each hidden entity's best-ranked remembered stand-in of the same shape (none without memory)."""
        if not self.use_memory:
            return {}
        task = attempt.spec.task
        query = {"subject": self.subject_of(task), "query": task.instruction, "k": 3}
        found = await attempt.engine.execute_step(
            attempt.session_id, StepKind.TOOL, ToolPayload(tool="memory_search", params=query)
        )
        if not found.ok or not isinstance(found.output, dict):
            return {}
        remembered = [str(e) for hit in found.output.get("hits", []) for e in hit.get("entities", [])]
        return {e: m for e in hidden for m in reversed(remembered) if shape(m) == shape(e)}


def fill(plan: ExpertPlan, values: dict[str, str]) -> ExpertPlan:
    """`plan` with every string parameter (nested ones included) that is a key of `values` replaced."""

    def swap(value: object) -> object:
        if isinstance(value, str):
            return values.get(value, value)
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        return value

    steps = tuple(replace(step, params={k: swap(v) for k, v in step.params.items()}) for step in plan.steps)
    message = plan.final_message
    for hidden, value in values.items():
        message = message.replace(hidden, value)
    return replace(plan, steps=steps, final_message=message)


def run_conversations(
    env: DecisionEnv,
    conversations: Sequence[tuple[Task, Task]],
    agent: RecallingAgent,
    store: SessionStore,
    *,
    seed: int = 0,
    label: str = "",
) -> tuple[list[Ran], list[Ran]]:
    """Every first turn, then every follow-up (so a follow-up is `len(conversations)` turns after its
    first, recorded as `metadata.turn_gap`); returns the first turns' and follow-ups' results."""
    gap = len(conversations)
    runs = []
    for turn in (1, 2):
        specs = [
            EpisodeSpec(
                pair[turn - 1],
                session_id=f"{label}{agent.name}-{pair[turn - 1].task_id}",
                seed=stream_seed(seed, pair[turn - 1].task_id),
                metadata={"turn": turn, "turn_gap": gap if turn == 2 else 0, "label": label + agent.name},
            )
            for pair in conversations
        ]
        runs.append(asyncio.run(run_episodes(env, specs, agent, store)))
    return runs[0], runs[1]


__all__ = ["UNKNOWN", "RecallingAgent", "fill", "run_conversations", "shape"]
