"""Episodes through the orchestrator into the store: a policy (or the expert) attempts one task per session.

A policy episode runs::

    init_session (metadata: task_id, env, split, policy_version, expected_entities, group, ...)
    tool step, the policy choosing ──▶ its JSON action; a tool call runs, or the text is kept as a failed step
    ... until the policy answers {"final": ...}, the domain ends the task, or `max_steps` policy calls
    finish (the final message) ──▶ a `task_outcome` feedback: 1.0 when `episode.success(...)`, else 0.0

An expert episode sends the expert's plan, calls each step's tool as planned (again, up to
`expert_retries` times, after a retryable failure such as `UNAVAILABLE`), finishes with the expert's
message and is judged the same way; imitation learning reads those sessions back from the store, so a
demonstration that met a transient fault shows the failed call, the error and the call made again.

Each episode gets its own skills (bound to its own copy of the domain state), executor and orchestrator,
on a manual clock: simulated latencies and retry back-offs are recorded in contract time without being
waited for. Episodes run concurrently (`RolloutConfig.concurrency`); the policy backend batches their
requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessionrl.envs.base import DecisionEnv, Episode, ExpertPlan, Task
from sessionrl.envs.faults import Faults, inject_plan_faults
from sessionrl.errors import NotFound
from sessionrl.eval.metrics import task_success
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.policy import PolicyBackend, parse_tool_call
from sessionrl.orchestrator.results import LLMPayload, PlanPayload, StepKind, StepResult, ToolPayload
from sessionrl.policy.llm import parse_final, system_prompt, tool_message
from sessionrl.policy.references import Context, resolve
from sessionrl.session.model import Anchor, Feedback, FeedbackType, Message, Plan, SessionCreate, SubGoal
from sessionrl.skills import ExecutorConfig, ManualClock, SkillExecutor
from sessionrl.store import SessionStore

UNPARSEABLE = "UNPARSEABLE_ACTION"
"""Error code of the tool message that answers a reply which is neither a tool call nor a final answer."""


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    """How episodes are run."""

    max_steps: int = field(default=8, metadata={"help": "policy calls per episode before it is cut off"})
    concurrency: int = field(default=32, metadata={"help": "episodes in flight at once"})
    max_tool_chars: int = field(default=400, metadata={"help": "a tool message is cut to this length"})
    full_schemas: bool = field(
        default=True, metadata={"help": "show each tool's whole JSON schema; false: names and parameters"}
    )
    domain_policy: bool = field(
        default=True, metadata={"help": "open the system prompt with the domain's policy text"}
    )
    max_invalid: int = field(
        default=2, metadata={"help": "consecutive replies that are not actions before the episode ends"}
    )
    expert_retries: int = field(
        default=2, metadata={"help": "times the expert calls a step again after a retryable failure"}
    )
    executor: ExecutorConfig = field(
        default_factory=ExecutorConfig, metadata={"help": "retries and back-off of every episode's executor"}
    )

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.concurrency < 1 or self.max_tool_chars < 16 or self.max_invalid < 1:
            raise ValueError(
                "RolloutConfig needs max_steps, concurrency and max_invalid >= 1 and max_tool_chars >= 16"
            )
        if self.expert_retries < 0:
            raise ValueError(f"RolloutConfig.expert_retries must be >= 0, got {self.expert_retries}")


@dataclass(frozen=True, slots=True)
class EpisodeSpec:
    """One episode to run: the task, its session id, the seed of its randomness and its faults."""

    task: Task
    session_id: str
    seed: int = 0
    faults: Faults | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Extra session metadata (a GRPO group, an iteration, a stage, ...)."""


def expected_entities(task: Task, plan: ExpertPlan) -> list[str]:
    """The request's entities a solution must pass to its tools: string parameters of the expert's
    plan that the user's message names (order numbers, SKUs, phones, waybills, addresses), in order."""
    values = [v for step in plan.steps for v in step.params.values() if isinstance(v, str)]
    named = (v for v in values if re.search(rf"(?<!\w){re.escape(v)}(?!\w)", task.instruction))
    return list(dict.fromkeys(named))


def session_metadata(
    env: DecisionEnv, spec: EpisodeSpec, policy_version: int | None, expert: ExpertPlan
) -> dict[str, Any]:
    """What every episode's session records about itself (`sessionrl.eval.metrics` reads some of it)."""
    return {
        "task_id": spec.task.task_id,
        "env": env.name,
        "split": spec.task.split.value,
        "policy_version": policy_version,
        "seed": spec.seed,
        "expected_entities": expected_entities(spec.task, expert),
        **spec.metadata,
    }


def prompt_messages(env: DecisionEnv, task: Task, config: RolloutConfig) -> list[Message]:
    """The conversation an episode starts from: the system prompt and the user's request."""
    policy = env.system_prompt() if config.domain_policy else f"You act for the {env.name} service."
    system = system_prompt(policy, env.contracts(), full_schemas=config.full_schemas)
    return [
        Message(role="system", content=system),
        Message(role="user", content=task.instruction),
    ]


def observation(tool: str, result: StepResult, max_chars: int) -> Message:
    """The result of a call of `tool` as the agent reads it: the output, or why the step failed."""
    return tool_message(
        tool=tool,
        ok=result.ok,
        output=result.output,
        error_code=result.error_code,
        error_message=result.error_message,
        max_chars=max_chars,
    )


async def _judge(
    engine: Orchestrator, session_id: str, episode: Episode, said: Sequence[str], env: str
) -> bool:
    """Judge the episode and record the verdict as `task_outcome` feedback; return whether it succeeded."""
    outcome = episode.outcome(said)
    feedback = Feedback(
        type=FeedbackType.TASK_OUTCOME,
        score=1.0 if outcome.success else 0.0,
        comment=outcome.detail or None,
        annotator=f"{env}_judge",
        data={"checks": dict(outcome.checks)},
    )
    await engine.inject_feedback(session_id, feedback)
    return outcome.success


async def run_episode(
    env: DecisionEnv,
    spec: EpisodeSpec,
    backend: PolicyBackend,
    store: SessionStore,
    config: RolloutConfig,
    *,
    policy_version: int | None = None,
) -> bool:
    """Let the policy attempt `spec.task` in session `spec.session_id`; return whether it succeeded."""
    episode = env.episode(spec.task, seed=spec.seed, faults=spec.faults)
    meta = session_metadata(env, spec, policy_version, env.expert(spec.task))
    executor = SkillExecutor(episode.skills(), config.executor, clock=ManualClock())
    async with executor, Orchestrator(store, executor, [backend]) as engine:
        create = SessionCreate(
            user_query=spec.task.instruction, session_id=spec.session_id, scenario=env.name, metadata=meta
        )
        sid = await engine.init_session(create)
        messages = prompt_messages(env, spec.task, config)
        final: str | None = None
        invalid = 0
        for _ in range(config.max_steps):
            asked = await engine.execute_step(
                sid, StepKind.LLM, LLMPayload(messages=tuple(messages), purpose="act")
            )
            if not asked.ok:
                break
            final = await _act(engine, sid, asked, messages, config)
            invalid = invalid + 1 if _was_invalid(messages) else 0
            if final is not None or episode.terminated or invalid >= config.max_invalid:
                break
        await engine.finish(sid, final or "")
        return await _judge(engine, sid, episode, [final] if final else [], env.name)


async def _act(
    engine: Orchestrator, sid: str, asked: StepResult, messages: list[Message], config: RolloutConfig
) -> str | None:
    """Carry out one reply of the policy: the final message it gives (references resolved), or None after
    running the tool call it asks for in `messages`.

    A reply that is neither is answered in `messages` and recorded as an `auto_validation` verdict of 0
    anchored to the LLM call, so rewards can charge the reply that broke the format."""
    text = asked.text or ""
    messages.append(Message(role="assistant", content=text))
    context = Context.from_messages(messages)
    answer = parse_final(text)
    if answer is not None:
        return str(resolve(answer, context))
    choice = parse_tool_call(text)
    if choice is None:
        why = 'not an action: answer {"tool": ..., "params": {...}} or {"final": ...}'
        messages.append(tool_message(tool=None, ok=False, error_code=UNPARSEABLE, error_message=why))
        verdict = Feedback(
            type=FeedbackType.AUTO_VALIDATION,
            score=0.0,
            comment=f"{UNPARSEABLE}: {why}",
            annotator="action_parser",
            anchor=Anchor(call_id=asked.call_id),
        )
        await engine.inject_feedback(sid, verdict)
        return None
    params = resolve(choice.params, context)
    payload = ToolPayload(tool=choice.tool, params=params, subgoal_id=choice.subgoal_id)
    result = await engine.execute_step(sid, StepKind.TOOL, payload)
    messages.append(observation(choice.tool, result, config.max_tool_chars))
    return None


def _was_invalid(messages: Sequence[Message]) -> bool:
    """Whether the last reply was not an action (its answer is the UNPARSEABLE tool message)."""
    last = messages[-1]
    return last.role == "tool" and f'"error":"{UNPARSEABLE}"' in last.content


async def run_expert(env: DecisionEnv, spec: EpisodeSpec, store: SessionStore, config: RolloutConfig) -> bool:
    """Replay the expert's plan for `spec.task` in session `spec.session_id`; return whether it succeeded.

    A `plan_order` fault may reverse the plan, as it arrives; the guards then refuse the steps whose
    dependencies have not run.
    """
    expert = env.expert(spec.task)
    faults = spec.faults or Faults()
    plan = inject_plan_faults(expert, faults, _plan_rng(spec))
    episode = env.episode(spec.task, seed=spec.seed, faults=spec.faults)
    meta = session_metadata(env, spec, None, expert) | {"expert": True}
    executor = SkillExecutor(episode.skills(), config.executor, clock=ManualClock())
    async with executor, Orchestrator(store, executor) as engine:
        create = SessionCreate(
            user_query=spec.task.instruction, session_id=spec.session_id, scenario=env.name, metadata=meta
        )
        sid = await engine.init_session(create)
        subgoals = [
            SubGoal(id=s.id, description=s.description, tool=s.tool, depends_on=s.depends_on)
            for s in plan.steps
        ]
        planned = await engine.execute_step(
            sid, StepKind.PLAN, PlanPayload(plan=Plan(root_goal=plan.goal, subgoals=tuple(subgoals)))
        )
        if planned.ok:
            for step in plan.steps:
                payload = ToolPayload(tool=step.tool, params=dict(step.params), subgoal_id=step.id)
                for _ in range(1 + config.expert_retries):
                    result = await engine.execute_step(sid, StepKind.TOOL, payload)
                    if result.ok or not result.retryable:
                        break
                if episode.terminated:
                    break
            await engine.finish(sid, plan.final_message)
        said = [plan.final_message] if planned.ok else []
        return await _judge(engine, sid, episode, said, env.name)


def _plan_rng(spec: EpisodeSpec) -> random.Random:
    return random.Random(f"plan:{spec.seed}:{spec.session_id}")


def settle(store: SessionStore, spec: EpisodeSpec) -> tuple[EpisodeSpec, bool | None]:
    """Make re-running an episode safe: the recorded verdict when its session already ran to the end, else
    the spec with a session id still free (`<id>.1`, `<id>.2`, ... after an interrupted attempt)."""
    candidate = spec
    for attempt in range(1, 1000):
        try:
            session = store.get(candidate.session_id)
        except NotFound:
            return candidate, None
        verdict = task_success(session)
        if verdict is not None:
            return candidate, verdict
        candidate = dataclasses.replace(spec, session_id=f"{spec.session_id}.{attempt}")
    raise RuntimeError(f"episode {spec.session_id!r} was interrupted too often")


@dataclass(frozen=True, slots=True)
class Ran:
    """One finished episode: the session that holds it, and whether it solved its task."""

    session_id: str
    success: bool


async def rollout(
    env: DecisionEnv,
    specs: Sequence[EpisodeSpec],
    backend: PolicyBackend | None,
    store: SessionStore,
    config: RolloutConfig,
    *,
    policy_version: int | None = None,
) -> list[Ran]:
    """Run every episode of `specs`, `config.concurrency` at a time (the expert's when `backend` is None).

    Returns one `Ran` per spec, in order. An episode whose session already ran to its end is not run again.
    """
    gate = asyncio.Semaphore(config.concurrency)

    async def one(spec: EpisodeSpec) -> Ran:
        spec, verdict = await asyncio.to_thread(settle, store, spec)
        if verdict is not None:
            return Ran(spec.session_id, verdict)
        async with gate:
            if backend is None:
                ok = await run_expert(env, spec, store, config)
            else:
                ok = await run_episode(env, spec, backend, store, config, policy_version=policy_version)
        return Ran(spec.session_id, ok)

    return list(await asyncio.gather(*(one(spec) for spec in specs)))


__all__ = [
    "EpisodeSpec",
    "Ran",
    "RolloutConfig",
    "expected_entities",
    "observation",
    "prompt_messages",
    "rollout",
    "run_episode",
    "run_expert",
    "session_metadata",
    "settle",
]
