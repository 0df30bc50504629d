"""The app factory's process tuning: the young-generation collection threshold while a service runs."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from service_support import make_app, serving

from sessionrl.service.app import YOUNG_GC_THRESHOLD, young_gc_threshold


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    """Python's defaults for the test, whatever the process had; the process's own restored after."""
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield gc.get_threshold()
    gc.set_threshold(*before)


async def test_a_running_service_collects_young_garbage_less_often(thresholds: tuple[int, int, int]) -> None:
    async with serving(make_app()) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, 10, 10)
    assert gc.get_threshold() == thresholds


def test_a_higher_threshold_is_kept_and_the_old_ones_come_back(thresholds: tuple[int, int, int]) -> None:
    with young_gc_threshold(5_000):
        assert gc.get_threshold() == (5_000, 10, 10)
        with young_gc_threshold(1_000):
            assert gc.get_threshold() == (5_000, 10, 10)
        assert gc.get_threshold() == (5_000, 10, 10)
    assert gc.get_threshold() == thresholds
