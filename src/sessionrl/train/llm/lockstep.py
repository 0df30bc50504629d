"""Episodes whose policy calls are batched in lockstep, so a seeded run samples the same replies every time.

The policy's own batcher (`sessionrl.policy.llm.Batcher`) starts a batch after a quiet window, so which
requests share a batch, and in which order they draw from the sampling generator, follow the machine's
timing. Here a batch starts only once every episode still running has asked for its next reply: each
batch is then "the next call of every unfinished episode", whatever the timing, and its rows are put in
the order of their conversations' text, then of their sessions' ids, before they draw. Episodes whose
conversations are identical (the K episodes of a GRPO group before they part) would otherwise draw in
the order they happened to ask; the group would hold the same replies, but under other ids, and the
reward shaper (which scores in id order, each score reading the statistics of those before it) and the
update would then see them in another order. The id is that of the session whose episode asks, which
`LockstepAgent` sets in the episode's asyncio task, as `EpisodeSkills` binds its skills.

Every episode of the batch must be able to run at once: `LockstepAgent` needs the rollout's concurrency and
the engine's LLM lane at least as wide as the number of episodes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from sessionrl.envs.base import Task
from sessionrl.episodes.driver import Attempt
from sessionrl.episodes.llm import PolicyAgent
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.policy import PolicyBackend, PolicyError, PolicyReply
from sessionrl.policy.llm import HFPolicy
from sessionrl.policy.toolcalls import ToolFormat
from sessionrl.session.model import Message

Conversation = tuple[tuple[str, str], ...]
Seat = tuple[Conversation, str]
"""Where a call sits in its round: its conversation, then the id of the session asking."""

_SESSION: ContextVar[str] = ContextVar("sessionrl_lockstep_session", default="")


@contextmanager
def seat(session_id: str) -> Iterator[None]:
    """The lockstep calls the current asyncio task makes until the block ends ask for `session_id`."""
    token = _SESSION.set(session_id)
    try:
        yield
    finally:
        _SESSION.reset(token)


@dataclass(eq=False)
class Lockstep:
    """A policy backend that answers `episodes` concurrent episodes one round at a time (see module doc)."""

    policy: HFPolicy
    episodes: int
    """Episodes still running; a round starts when that many wait (each ending one lowers it)."""
    rounds: list[int] = field(default_factory=list)
    """Size of every round sampled, in order."""
    _waiting: list[tuple[Seat, Sequence[Message], asyncio.Future[PolicyReply]]] = field(default_factory=list)
    _running: asyncio.Task[None] | None = None

    @property
    def tool_format(self) -> ToolFormat:
        """The policy's tool-call format, which the episodes it serves write and read."""
        return self.policy.tool_format

    async def generate(self, messages: Sequence[Message], *, purpose: str) -> PolicyReply:
        """The reply to `messages`, sampled in the round every running episode joins."""
        future: asyncio.Future[PolicyReply] = asyncio.get_running_loop().create_future()
        place = (tuple((m.role, m.content) for m in messages), _SESSION.get())
        self._waiting.append((place, messages, future))
        self._release()
        return await future

    def leave(self) -> None:
        """One episode ended: the round no longer waits for it."""
        self.episodes -= 1
        self._release()

    def _release(self) -> None:
        if self._running is not None or not self._waiting or len(self._waiting) < self.episodes:
            return
        batch = sorted(self._waiting, key=lambda w: w[0])
        self._waiting = []
        self._running = asyncio.get_running_loop().create_task(self._sample(batch))

    async def _sample(self, batch: list[tuple[Seat, Sequence[Message], asyncio.Future[PolicyReply]]]) -> None:
        self.rounds.append(len(batch))
        try:
            replies = await asyncio.to_thread(self.policy.generate_now, [m for _, m, _ in batch])
        except Exception as exc:  # every waiter learns why its round failed
            error = exc if isinstance(exc, PolicyError) else PolicyError(str(exc))
            for *_, future in batch:
                future.set_exception(error)
        else:
            for (*_, future), reply in zip(batch, replies, strict=True):
                future.set_result(reply)
        finally:
            self._running = None
        self._release()


@dataclass(frozen=True, slots=True)
class LockstepAgent:
    """A `PolicyAgent` acting through a `Lockstep`, which it tells when its episode ends."""

    lockstep: Lockstep
    policy_version: int | None = None
    name: str = "llm"

    @property
    def backends(self) -> Sequence[PolicyBackend]:
        """The lockstep, which serves every LLM step of the batch."""
        return (self.lockstep,)

    def engine_config(self, base: OrchestratorConfig, tasks: Sequence[Task]) -> OrchestratorConfig:
        """`base` with an LLM lane wide enough for every episode to wait in one round."""
        if base.llm_lane.concurrency >= self.lockstep.episodes:
            return base
        lane = base.llm_lane.model_copy(update={"concurrency": self.lockstep.episodes})
        return base.model_copy(update={"llm_lane": lane})

    async def act(self, attempt: Attempt) -> str | None:
        """The policy agent's episode; the lockstep stops waiting for it once it ends, however it ends."""
        try:
            with seat(attempt.session_id):
                return await PolicyAgent(self.lockstep, self.policy_version, self.name).act(attempt)
        finally:
            self.lockstep.leave()


__all__ = ["Lockstep", "LockstepAgent", "seat"]
