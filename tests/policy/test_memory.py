"""`give_back_freed`: pages freed inside the allocator's heaps go back to the system."""

from __future__ import annotations

import ctypes.util
import os
import threading
from pathlib import Path

import pytest

import sessionrl.policy.memory as memory
from sessionrl.policy.memory import give_back_freed

GLIBC = memory._malloc_trim() is not None


def resident_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_freed_heap_pages_return_to_the_system() -> None:
    kept: list[bytes] = []

    def allocate() -> None:  # in a thread of its own, so in an arena other than the main one
        chunks = [b"x" * 60_000 for _ in range(4000)]  # 240 MB in blocks below the mmap threshold
        kept.append(chunks[-1])  # the last block stays, so the heap's top is not free to trim

    worker = threading.Thread(target=allocate)
    worker.start()
    worker.join()
    held = resident_mb()
    assert give_back_freed()
    assert held - resident_mb() > 120
    assert kept[0] == b"x" * 60_000


def test_give_back_freed_without_malloc_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    memory._malloc_trim.cache_clear()
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    try:
        assert memory.give_back_freed() is False
    finally:
        memory._malloc_trim.cache_clear()
