"""Fixtures of the reward tests: the shipped penalty table and a scoring context around it."""

from __future__ import annotations

import pytest
from rewards_support import at

from sessionrl.rewards.judge.runner import JudgeRunner
from sessionrl.rewards.judge.table import PenaltyTable, load_penalty_table
from sessionrl.rewards.terms import ScoringContext


@pytest.fixture(scope="session")
def table() -> PenaltyTable:
    return load_penalty_table()


@pytest.fixture
def ctx(table: PenaltyTable) -> ScoringContext:
    """A context with the shipped penalty table and the offline judge."""
    return ScoringContext(now=at(1000), penalties=table, judge=JudgeRunner())
