"""One driver for every episode: any agent attempts one task as one Decision Session.

    init_session (see `sessionrl.episodes.metadata`)
    the agent acts through the engine: plan and tool steps for a scripted plan, LLM and tool steps for a
        language-model policy, tool steps picked one at a time for a structured policy
    finish (the agent's final message, or "" when it gave none), unless a guard refused the plan, which
        closes the session as `rejected`
    inject_feedback ──▶ the `task_outcome` verdict of the env's checker (see `sessionrl.episodes.verdict`)

A batch runs on one engine over `EpisodeSkills`: each episode gets its own skills (bound to its own copy
of the domain state) and its own executor, on a manual clock, so simulated latencies and retry back-offs
are recorded in contract time without being waited for, while the episodes share the engine's lanes and
its group commit. The agent says which guards the engine needs (`Agent.engine_config`) and which policy
backends serve its LLM steps. Episodes run `RolloutConfig.concurrency` at a time.

Re-running a batch is safe (`settle`): an episode whose session already holds a verdict is not run again,
and one whose session was left open by an interrupted run gets a fresh id (`<id>.1`, `<id>.2`, ...).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sessionrl.envs.base import DecisionEnv, Episode, Task
from sessionrl.envs.faults import Faults
from sessionrl.episodes.config import RolloutConfig
from sessionrl.episodes.metadata import session_create
from sessionrl.episodes.skills import EpisodeSkills
from sessionrl.episodes.verdict import task_success, verdict, why_unsolved
from sessionrl.errors import NotFound
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.policy import PolicyBackend
from sessionrl.session.model import Session, SessionState
from sessionrl.skills import ManualClock, SkillExecutor
from sessionrl.store import SessionStore


@dataclass(frozen=True, slots=True)
class EpisodeSpec:
    """One episode to run: the task, its session id, the seed of its randomness and its faults.

    With `session_id` None the store names the session, and the episode always runs (nothing to settle).
    """

    task: Task
    session_id: str | None = None
    seed: int = 0
    faults: Faults | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Extra session metadata (a GRPO group, an iteration, a stage, ...)."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """An episode under way, as its agent sees it: the engine and session to act through, the env, the
    spec, the episode (its domain state and checker) and the run's episode settings."""

    engine: Orchestrator
    session_id: str
    env: DecisionEnv
    spec: EpisodeSpec
    episode: Episode
    config: RolloutConfig


class Agent(Protocol):
    """Who acts in an episode: a scripted plan, a language-model policy, a structured policy."""

    @property
    def name(self) -> str:
        """The session's `agent` metadata ("expert", "gold", "llm", "structured")."""
        ...

    @property
    def policy_version(self) -> int | None:
        """The acting policy's version (None for scripted plans)."""
        ...

    @property
    def backends(self) -> Sequence[PolicyBackend]:
        """The policy backends the engine serves LLM steps with (none for agents that make no LLM step)."""
        ...

    def engine_config(self, base: OrchestratorConfig, tasks: Sequence[Task]) -> OrchestratorConfig:
        """The engine's configuration for a batch of `tasks`: `base`, with what this agent needs changed."""
        ...

    async def act(self, attempt: Attempt) -> str | None:
        """Take the episode's steps; return the final message to the user (None: it gave none)."""
        ...


@dataclass(frozen=True, slots=True)
class Ran:
    """One finished episode: its session, whether it solved its task, and if not why (`why_unsolved`)."""

    session_id: str
    success: bool
    reason: str | None = None

    @classmethod
    def of(cls, session: Session) -> Ran:
        """The result a judged session records."""
        reason = why_unsolved(session)
        return cls(session.session_id, reason is None, reason)


async def run_episode(
    engine: Orchestrator, env: DecisionEnv, spec: EpisodeSpec, agent: Agent, config: RolloutConfig
) -> Session:
    """Let `agent` attempt `spec.task` as one session of `engine` (built over `EpisodeSkills`); return the
    session, finished and judged."""
    skills = engine.executor
    if not isinstance(skills, EpisodeSkills):
        raise TypeError("the engine must be built over EpisodeSkills: Orchestrator(store, EpisodeSkills())")
    create = session_create(
        env,
        spec.task,
        agent=agent.name,
        seed=spec.seed,
        session_id=spec.session_id,
        policy_version=agent.policy_version,
        extra=spec.metadata,
    )
    # opened before binding, so no task the engine starts for its first commit keeps this episode alive
    session_id = await engine.init_session(create)
    episode = env.episode(spec.task, seed=spec.seed, faults=spec.faults)
    settings = config.executor.model_copy(update={"seed": spec.seed})
    async with SkillExecutor(episode.skills(), settings, clock=ManualClock()) as executor:
        with skills.bind(executor):
            final = await agent.act(Attempt(engine, session_id, env, spec, episode, config))
            if (await engine.session(session_id)).state is not SessionState.REJECTED:
                await engine.finish(session_id, final or "")  # a refused plan closed the session already
            outcome = episode.outcome([final] if final else [])
            await engine.inject_feedback(session_id, verdict(env.name, outcome))
    return await engine.session(session_id)


def settle(store: SessionStore, spec: EpisodeSpec) -> tuple[EpisodeSpec, Session | None]:
    """Make re-running an episode safe: its recorded session when it already ran to its verdict, else the
    spec with a session id still free (`<id>.1`, `<id>.2`, ... after an interrupted attempt)."""
    first = spec.session_id
    if first is None:
        return spec, None
    for attempt in range(1000):
        session_id = f"{first}.{attempt}" if attempt else first
        candidate = dataclasses.replace(spec, session_id=session_id)
        try:
            session = store.get(session_id)
        except NotFound:
            return candidate, None
        if task_success(session) is not None:
            return candidate, session
    raise RuntimeError(f"episode {first!r} was interrupted too often")


async def run_episodes(
    env: DecisionEnv,
    specs: Sequence[EpisodeSpec],
    agent: Agent,
    store: SessionStore,
    config: RolloutConfig | None = None,
    *,
    orchestrator: OrchestratorConfig | None = None,
    done: Callable[[Ran], None] = lambda _: None,
) -> list[Ran]:
    """Run `agent` on every episode of `specs` on one engine, `config.concurrency` at a time.

    The engine is configured by `orchestrator` (the run's settings; defaults otherwise) as the agent
    adjusts it for these tasks. Returns one `Ran` per spec, in order; `done` hears of each as it ends. An
    episode whose session already ran to its verdict is not run again.
    """
    config = config or RolloutConfig()
    gate = asyncio.Semaphore(config.concurrency)
    engine_config = agent.engine_config(orchestrator or OrchestratorConfig(), [s.task for s in specs])
    async with Orchestrator(store, EpisodeSkills(), agent.backends, config=engine_config) as engine:

        async def one(spec: EpisodeSpec) -> Ran:
            spec, recorded = await asyncio.to_thread(settle, store, spec)
            if recorded is None:
                async with gate:
                    recorded = await run_episode(engine, env, spec, agent, config)
            ran = Ran.of(recorded)
            done(ran)
            return ran

        return list(await asyncio.gather(*(one(spec) for spec in specs)))
