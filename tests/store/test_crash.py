"""Kill a writer with SIGKILL at random moments: every acknowledged event survives, nothing half-written does.

A forked child appends events to a store (a file, or a PostgreSQL schema) and reports each acknowledged
`(session_id, seq)` through a pipe right after the call returns. The parent kills it at a random moment,
reopens the store and checks what survived. Databases are reused for several trials, so recovery after a
crash is itself crashed into.
"""

from __future__ import annotations

import random

import pytest
from store_support import FreshURL

from research.crash import run_trial, survivors

pytestmark = pytest.mark.slow

TRIALS = {"sqlite": 100, "postgresql": 40}
"""Trials per backend: on PostgreSQL the writer's transactions end in the server, so fewer trials cover
the same ground (a kill leaves an open transaction for the server to roll back, not a file to recover)."""
TRIALS_PER_DB = 5


def test_acknowledged_writes_survive_sigkill(store_backend: str, fresh_url: FreshURL) -> None:
    rng = random.Random(2026)
    trials = TRIALS[store_backend]
    total = 0
    for first in range(0, trials, TRIALS_PER_DB):
        with fresh_url() as url:
            for trial in range(first, first + TRIALS_PER_DB):
                acked = run_trial(url, trial, rng)
                total += len(acked)
                found = survivors(url, trial, acked)
                assert found.lost == 0, found
                assert found.broken == (), found
                assert found.drift == (), found
    assert total >= trials  # every trial acknowledged at least its first write
