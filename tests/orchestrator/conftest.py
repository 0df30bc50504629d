"""Fixtures for the orchestrator tests: an in-memory store, contracts, and engines over real skills."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
from orchestrator_support import MakeContract, MakeEngine

from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.policy import PolicyBackend
from sessionrl.skills import ExecutorConfig, ManualClock, Skill, SkillContract, SkillExecutor
from sessionrl.store import SessionStore


@pytest.fixture
def store() -> Iterator[SessionStore]:
    with SessionStore.open("sqlite://") as opened:
        yield opened


@pytest.fixture
def make_contract() -> MakeContract:
    """`make_contract(name, **fields)`: a contract taking any object and answering any object."""

    def build(name: str, **fields: Any) -> SkillContract:
        return SkillContract.model_validate(
            {"name": name, "description": f"The {name} skill.", "input_schema": {"type": "object"}, **fields}
        )

    return build


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def make_engine(store: SessionStore, clock: ManualClock) -> AsyncIterator[MakeEngine]:
    """`make_engine(skills, backends=(), config=None, **executor_fields)`: an engine on the shared store,
    its executor on the manual clock; every engine made is closed after the test."""
    made: list[Orchestrator] = []

    def build(
        skills: Sequence[Skill],
        backends: Sequence[PolicyBackend] = (),
        config: OrchestratorConfig | None = None,
        **executor_fields: Any,
    ) -> Orchestrator:
        fields = {"backoff_initial_s": 0.0, "jitter_s": 0.0, **executor_fields}
        executor = SkillExecutor(skills, ExecutorConfig(**fields), clock=clock)
        engine = Orchestrator(store, executor, backends, config)
        made.append(engine)
        return engine

    yield build
    for engine in made:
        await engine.aclose()
