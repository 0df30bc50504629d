"""One engine, many episodes: the executor that routes each step to the skills of the episode running it.

Every episode has its own domain state, so its skills differ from every other episode's, yet an engine
takes one executor. `EpisodeSkills` is that executor: it forwards each call to the `SkillExecutor` bound
(with `bind`) in the asyncio task running the episode, so concurrent episodes on one engine never touch
each other's state while they share its lanes and its group commit.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from sessionrl.skills import SkillContract, SkillExecutor, SkillResult

_BOUND: ContextVar[SkillExecutor | None] = ContextVar("sessionrl_episode_executor", default=None)


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
