"""Counterfactual hard negatives: at a failed session's failing step, replay the alternatives in the
simulator and pair the best against the worst for DPO.

    failing step  the call the judge's reflection pins the failure to (`sessionrl.reflection.reflect`), or,
                  when it pins none, the first expert step the session's calls did not do
    alternatives  the expert's action there; the same tool with one parameter perturbed (an id with its
                  digits changed, an amount halved or raised by half, another enum value); the other
                  tools with the expert's parameters (the masked tools); and what the session did there
    score         each alternative replayed on a fresh episode of the task and seed: the session's
                  successful calls before the step, the alternative, then the expert's remaining steps
                  and its reply; the share of the checker's checks that pass, minus 1 when the
                  alternative's own call failed
    pair          the prompt is the conversation before the step (as the policy read it); chosen the best
                  alternative, rejected the worst (a plausible action that spoils the task): a hard
                  negative. `random_pair` gives the same prompt and chosen against a random action of
                  another task, the usual easy negative, for comparison.

The pairs are `sessionrl.train.llm.dpo.Preference`s, ready for `DPOTrainer.fit`.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessionrl.envs.base import DecisionEnv, ExpertStep, Split, Task, error_kinds
from sessionrl.policy.llm import final_action, tool_action
from sessionrl.policy.references import Context, abstract
from sessionrl.reflection import reflect
from sessionrl.session import CallStatus, Message, Session
from sessionrl.skills import ExecutorConfig, ManualClock, SkillExecutor
from sessionrl.train.llm.data import demonstration_replies
from sessionrl.train.llm.dpo import Preference

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Alternative:
    """One action that could have been taken at the failing step, and how its replay scored."""

    kind: str
    """`expert`, `perturbed`, `masked_tool`, `taken` (what the session did) or `random`."""
    tool: str
    params: Json
    score: float = 0.0


def perturbed(params: Mapping[str, Any], rng: random.Random) -> list[Json]:
    """`params` with one value changed at a time: digits of an id redrawn, numbers halved and raised by
    half, nested mappings perturbed one key deep; other values are kept.

    >>> [p["amount"] for p in perturbed({"amount": 10.0, "reason": "quality"}, random.Random(0))]
    [5.0, 15.0]
    """
    out: list[Json] = []
    for key, value in params.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            out += [{**params, key: round(value * factor, 2)} for factor in (0.5, 1.5)]
        elif isinstance(value, str) and any(c.isdigit() for c in value):
            redrawn = re.sub(r"\d", lambda _: str(rng.randrange(10)), value)
            if redrawn != value:
                out.append({**params, key: redrawn})
        elif isinstance(value, Mapping):
            out += [{**params, key: inner} for inner in perturbed(value, rng)]
    return out


async def replay_score(
    env: DecisionEnv,
    task: Task,
    prefix: Sequence[tuple[str, Json]],
    action: Alternative,
    rest: Sequence[ExpertStep],
    final: str,
    seed: int,
) -> float:
    """The score of `action` after `prefix`, continued by `rest` and `final` (see the module doc)."""
    episode = env.episode(task, seed=seed)
    async with SkillExecutor(
        episode.skills(), ExecutorConfig(max_attempts=1), clock=ManualClock()
    ) as executor:
        for tool, params in prefix:
            await executor.call(tool, params)
        ok = (await executor.call(action.tool, dict(action.params))).ok
        for step in rest:
            await executor.call(step.tool, dict(step.params))
    checks = episode.outcome([final]).checks
    passed = sum(checks.values()) / len(checks) if checks else 0.0
    return passed - (0.0 if ok else 1.0)


@dataclass(frozen=True, slots=True)
class FailingStep:
    """Where a failed session went wrong: the conversation before it, what was done before it (successful
    calls), what the session did there (None: nothing), and the expert's step there and after it."""

    messages: tuple[Message, ...]
    prefix: tuple[tuple[str, Json], ...]
    taken: tuple[str, Json] | None
    expert: tuple[ExpertStep, ...]
    final: str


def failing_step(
    env: DecisionEnv, task: Task, session: Session, system: str, max_tool_chars: int
) -> FailingStep | None:
    """The failing step of `session` (see the module doc); None when it did not fail."""
    plan = env.expert(task)
    reflection = reflect(session, plan, error_kinds(env))
    if reflection is None:
        return None
    calls = list(session.tool_calls)
    index = next((i for i, c in enumerate(calls) if c.call_id == reflection.call_id), len(calls))
    done = [c for c in calls[:index] if c.status == CallStatus.SUCCESS]
    done_tools = [c.tool for c in done]
    remaining = [s for s in plan.steps if not _consume(done_tools, s.tool)]
    if not remaining:
        return None  # the session did every expert step: its failure is not at a call
    replies = demonstration_replies(session, system, max_tool_chars)
    if index < len(replies):
        messages, taken = (
            replies[index].messages,
            (calls[index].tool, dict(calls[index].params)) if index < len(calls) else None,
        )
    else:
        messages = (Message(role="system", content=system), Message(role="user", content=session.user_query))
        taken = None
    prefix = tuple((c.tool, dict(c.params)) for c in done)
    return FailingStep(tuple(messages), prefix, taken, tuple(remaining), plan.final_message)


def _consume(tools: list[str], tool: str) -> bool:
    if tool in tools:
        tools.remove(tool)
        return True
    return False


def alternatives(env: DecisionEnv, step: FailingStep, rng: random.Random) -> list[Alternative]:
    """The expert's action at the failing step, its perturbations, the masked tools, and what was taken."""
    head = step.expert[0]
    found = [Alternative("expert", head.tool, dict(head.params))]
    found += [Alternative("perturbed", head.tool, p) for p in perturbed(head.params, rng)]
    found += [
        Alternative("masked_tool", c.name, dict(head.params)) for c in env.contracts() if c.name != head.tool
    ]
    if step.taken is not None:
        found.append(Alternative("taken", *step.taken))
    return found


def action_text(messages: Sequence[Message], alternative: Alternative) -> str:
    """The reply that takes `alternative`, with values the conversation holds written as references."""
    return tool_action(alternative.tool, abstract(alternative.params, Context.from_messages(messages)))


def counterfactual_pair(
    env: DecisionEnv, task: Task, session: Session, system: str, max_tool_chars: int, seed: int = 0
) -> tuple[Preference, list[Alternative]] | None:
    """The best against the worst replayed alternative at the failing step, and every scored alternative."""
    step = failing_step(env, task, session, system, max_tool_chars)
    if step is None:
        return None
    rng = random.Random(f"negatives:{seed}:{session.session_id}")
    episode_seed = int(session.metadata.get("seed", 0))

    async def scored() -> list[Alternative]:
        out = []
        for alt in alternatives(env, step, rng):
            score = await replay_score(env, task, step.prefix, alt, step.expert[1:], step.final, episode_seed)
            out.append(Alternative(alt.kind, alt.tool, alt.params, score))
        return out

    ranked = sorted(asyncio.run(scored()), key=lambda a: (-a.score, a.kind != "expert"))
    best, worst = ranked[0], ranked[-1]
    chosen, rejected = action_text(step.messages, best), action_text(step.messages, worst)
    if best.score <= worst.score or chosen == rejected:
        return None
    return Preference(session.session_id, "counterfactual", step.messages, chosen, rejected), ranked


def random_pair(counterfactual: Preference, env: DecisionEnv, rng: random.Random) -> Preference:
    """The same prompt and chosen reply against a random action: a random expert step of a random task of
    the training split, or a final answer that says nothing (the usual easy negative)."""
    tasks = env.tasks(Split.TRAIN)
    steps = env.expert(rng.choice(tasks)).steps
    if steps and rng.random() < 0.8:
        step = rng.choice(steps)
        rejected = tool_action(step.tool, dict(step.params))
    else:
        rejected = final_action("Done.")
    return Preference(
        counterfactual.session_id, "random", counterfactual.messages, counterfactual.chosen, rejected
    )


__all__ = [
    "Alternative",
    "FailingStep",
    "action_text",
    "alternatives",
    "counterfactual_pair",
    "failing_step",
    "perturbed",
    "random_pair",
    "replay_score",
]
