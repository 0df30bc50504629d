"""Run scripted plans of an environment through the orchestrator, so demonstrations land in the store.

A run of one task is an ordinary Decision Session: the task's instruction opens it, the expert's plan is
its plan step, each plan step is one tool step (in plan order, naming its sub-goal), the expert's final
message finishes it, and a `task_outcome` feedback (score 1 or 0, the checks in `data`) says whether the
episode was solved. The session's metadata carries `env`, `split`, `task_id`, `agent` and `seed`, plus
`expected_entities` when the environment names them (see `NamesEntities`), as `sessionrl.eval` expects.

Every episode has its own domain state, so its skills differ from every other episode's, yet the engine
takes one executor. `EpisodeSkills` is that executor: it forwards each call to the `SkillExecutor` bound
(with `bind`) in the asyncio task running the episode, so concurrent episodes on one engine never touch
each other's state while they share its lanes and group commit. Each episode's executor runs on a
`ManualClock`: simulated latencies and retry back-offs are recorded in contract time, never waited for.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sessionrl.envs.base import (
    DecisionEnv,
    Episode,
    ExpertPlan,
    ExpertStep,
    Outcome,
    Split,
    Task,
    stream_seed,
)
from sessionrl.envs.faults import Faults, inject_plan_faults
from sessionrl.eval.metrics import task_success
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.results import PlanPayload, StepKind, ToolPayload
from sessionrl.session.model import Feedback, FeedbackType, Plan, Session, SessionCreate, SubGoal
from sessionrl.skills import ExecutorConfig, ManualClock, SkillContract, SkillExecutor, SkillResult
from sessionrl.store import SessionStore

Agent = Literal["expert", "gold"]
"""Who writes the plan: the environment's expert, or the task's gold actions (τ-bench style replay)."""

_BOUND: ContextVar[SkillExecutor | None] = ContextVar("sessionrl_episode_executor", default=None)


@runtime_checkable
class NamesEntities(Protocol):
    """An environment that can say which entities a correct solution of a task must use (for ER@5)."""

    def expected_entities(self, task: Task) -> Sequence[str]:
        """Ids or values a solution's tool calls must mention."""
        ...


class EpisodeSkills:
    """The engine's executor for episodes: serves the skills bound in the calling asyncio task.

    Use `with skills.bind(executor):` around an episode's steps. Outside a binding every method raises,
    because a step that ran there would act on no episode.
    """

    @property
    def contracts(self) -> dict[str, SkillContract]:
        """The contracts of the bound episode's skills."""
        return self._bound().contracts

    def masked(self) -> frozenset[str]:
        """The bound episode's skills whose breaker is open."""
        return self._bound().masked()

    async def call(self, name: str, params: Mapping[str, Any]) -> SkillResult:
        """Run the bound episode's skill `name`."""
        return await self._bound().call(name, params)

    @contextmanager
    def bind(self, executor: SkillExecutor) -> Iterator[SkillExecutor]:
        """Serve `executor`'s skills to the steps run by the current task until the block ends."""
        token = _BOUND.set(executor)
        try:
            yield executor
        finally:
            _BOUND.reset(token)

    @staticmethod
    def _bound() -> SkillExecutor:
        executor = _BOUND.get()
        if executor is None:
            raise RuntimeError("no episode is bound: run steps inside `with EpisodeSkills().bind(executor):`")
        return executor


def gold_plan(task: Task) -> ExpertPlan:
    """A τ-bench task's gold actions as a plan, ending with a message that says every expected output.

    As in the benchmark's replay, every action runs in its turn whether or not an earlier one failed, so
    the sub-goals depend on nothing.
    """
    actions = task.payload.get("actions")
    if actions is None:
        raise ValueError(f"task {task.task_id} has no gold actions; gold replay needs τ-bench-style tasks")
    steps = tuple(
        ExpertStep(f"g{i + 1}", f"gold action {i + 1}: {action['name']}", action["name"], action["kwargs"])
        for i, action in enumerate(actions)
    )
    outputs = task.payload.get("outputs", [])
    return ExpertPlan(
        goal=f"replay the gold actions of {task.task_id}", steps=steps, final_message=" ".join(outputs)
    )


def _plan_for(agent: Agent, env: DecisionEnv, task: Task) -> ExpertPlan:
    """The plan `agent` follows on `task`."""
    return env.expert(task) if agent == "expert" else gold_plan(task)


async def run_expert(
    engine: Orchestrator, env: DecisionEnv, task: Task, *, seed: int, faults: Faults | None = None
) -> Session:
    """Run the environment's expert on `task` through `engine` (built over `EpisodeSkills`).

    With `faults`, tool calls fail at its rates and the plan may arrive reordered (`plan_order`).
    """
    plan = env.expert(task)
    if faults is not None:
        plan = inject_plan_faults(plan, faults, random.Random(f"{seed}:plan"))
    return await run_session(engine, env, task, plan, agent="expert", seed=seed, faults=faults)


async def replay_gold(engine: Orchestrator, env: DecisionEnv, task: Task, *, seed: int) -> Session:
    """Replay a τ-bench task's gold actions through `engine` (see `gold_plan`)."""
    return await run_session(engine, env, task, gold_plan(task), agent="gold", seed=seed)


async def run_session(
    engine: Orchestrator,
    env: DecisionEnv,
    task: Task,
    plan: ExpertPlan,
    *,
    agent: Agent,
    seed: int,
    faults: Faults | None = None,
) -> Session:
    """Run `plan` on a fresh episode of `task` as one session; return it judged by a `task_outcome`."""
    skills = engine.executor
    if not isinstance(skills, EpisodeSkills):
        raise TypeError("the engine must be built over EpisodeSkills: Orchestrator(store, EpisodeSkills())")
    # opened before binding, so no task the engine starts for its first commit keeps this episode alive
    session_id = await engine.init_session(_create(env, task, agent=agent, seed=seed))
    episode = env.episode(task, seed=seed, faults=faults)
    executor = SkillExecutor(episode.skills(), ExecutorConfig(seed=seed), clock=ManualClock())
    async with executor:
        with skills.bind(executor):
            messages = await _drive(engine, session_id, episode, plan)
    outcome = episode.outcome(messages)
    await engine.inject_feedback(session_id, _verdict(env, outcome))
    return await engine.session(session_id)


def _create(env: DecisionEnv, task: Task, *, agent: Agent, seed: int) -> SessionCreate:
    metadata: dict[str, Any] = {
        "env": env.name,
        "split": task.split.value,
        "task_id": task.task_id,
        "agent": agent,
        "seed": seed,
    }
    if isinstance(env, NamesEntities):
        metadata["expected_entities"] = list(env.expected_entities(task))
    return SessionCreate(
        user_query=task.instruction,
        scenario=env.name,
        tags=(env.name, task.split.value, agent),
        metadata=metadata,
    )


def session_plan(plan: ExpertPlan) -> Plan:
    """The session's plan DAG for an expert plan: one sub-goal per step, with its tool and dependencies."""
    subgoals = tuple(
        SubGoal(id=step.id, description=step.description, tool=step.tool, depends_on=step.depends_on)
        for step in plan.steps
    )
    return Plan(root_goal=plan.goal, subgoals=subgoals)


async def _drive(engine: Orchestrator, session_id: str, episode: Episode, plan: ExpertPlan) -> list[str]:
    """Plan, one tool step per sub-goal, finish; returns the messages the user was sent.

    A rejected plan ends the session before any call, so the user hears nothing. Steps stop early once
    the domain ends the episode (a hand-off), as `envs.run_plan` does.
    """
    planned = await engine.execute_step(session_id, StepKind.PLAN, PlanPayload(plan=session_plan(plan)))
    if not planned.ok:
        return []
    for step in plan.steps:
        if episode.terminated:
            break
        payload = ToolPayload(tool=step.tool, params=dict(step.params), subgoal_id=step.id)
        await engine.execute_step(session_id, StepKind.TOOL, payload)
    await engine.finish(session_id, plan.final_message)
    return [plan.final_message]


def _verdict(env: DecisionEnv, outcome: Outcome) -> Feedback:
    return Feedback(
        type=FeedbackType.TASK_OUTCOME,
        score=1.0 if outcome.success else 0.0,
        comment=outcome.detail or "solved",
        annotator=f"{env.name}_checker",
        data={"checks": dict(outcome.checks), "detail": outcome.detail},
    )


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What a batch of runs gave: how many tasks, how many solved, which failed."""

    env: str
    split: Split
    agent: Agent
    n: int
    successes: int
    failed: tuple[str, ...]

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
        }


def run_many(
    env: DecisionEnv,
    split: Split,
    n: int | None = None,
    *,
    store: SessionStore,
    concurrency: int = 8,
    seed: int = 0,
    agent: Agent = "expert",
    progress: bool = True,
) -> RunSummary:
    """Run `agent` on the first `n` tasks of `split` (all with None), `concurrency` at a time, into `store`.

    Runs its own event loop, so call it from synchronous code; the progress bar goes to stderr. Each
    task's episode gets `stream_seed(seed, task_id)`. The engine's plan limit is raised to the longest
    plan of the batch, and one tool may serve several sub-goals (reading two orders), since an expert's
    plan is as long as its task needs.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    tasks = list(env.tasks(split))[:n]
    jobs = [(task, _plan_for(agent, env, task)) for task in tasks]
    longest = max((len(plan.steps) for _, plan in jobs), default=1)
    config = OrchestratorConfig(
        max_subgoals=max(longest, OrchestratorConfig().max_subgoals), repeated_tools=True
    )
    with _progress(progress, f"{env.name} {split} {agent}") as bar:
        track = bar.add_task("tasks", total=len(jobs))
        verdicts = asyncio.run(
            _run_jobs(store, config, env, jobs, agent, seed, concurrency, lambda: bar.advance(track))
        )
    failed = tuple(task.task_id for task in tasks if not verdicts[task.task_id])
    return RunSummary(env.name, split, agent, len(tasks), len(tasks) - len(failed), failed)


async def _run_jobs(
    store: SessionStore,
    config: OrchestratorConfig,
    env: DecisionEnv,
    jobs: Iterable[tuple[Task, ExpertPlan]],
    agent: Agent,
    seed: int,
    concurrency: int,
    done: Callable[[], None],
) -> dict[str, bool]:
    """Run the jobs on one engine with `concurrency` workers; returns whether each task was solved."""
    verdicts: dict[str, bool] = {}
    pending = iter(jobs)

    async def worker() -> None:
        for task, plan in pending:
            session = await run_session(
                engine, env, task, plan, agent=agent, seed=stream_seed(seed, task.task_id)
            )
            verdicts[task.task_id] = task_success(session) is True
            done()

    async with Orchestrator(store, EpisodeSkills(), config=config) as engine, asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())
    return verdicts


def _progress(enabled: bool, label: str) -> Progress:
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )
