"""Fixtures for the skill library tests: a contract builder, a manual clock and a scripted skill."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from skills_support import BASE, ContractFactory, Script, merge

from sessionrl.skills import ManualClock, SkillContract


@pytest.fixture
def make_contract() -> ContractFactory:
    """`make_contract(name=..., sla={...}, ...)`: the test contract with fields deep-merged over it."""

    def build(**overrides: Any) -> SkillContract:
        return SkillContract.model_validate(merge(BASE, overrides))

    return build


@pytest.fixture
def clock() -> ManualClock:
    """A clock that moves only when slept on or advanced."""
    return ManualClock()


@pytest.fixture
def script() -> Callable[..., Script]:
    """`script(outcome, ...)`: a fresh `Script`."""
    return lambda *outcomes: Script(outcomes)
