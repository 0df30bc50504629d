"""Handing freed memory back to the system.

The CPU engine frees gigabytes at once when it drops what it kept for the current weights (`KVStore`'s
caches, up to 3 GB for SmolLM2-135M; the bfloat16 copies). glibc's allocator keeps freed blocks inside its
heaps for later reuse, one set of heaps (an arena) per thread that allocated them, and returns to the
system only the free space at a heap's top. So a run whose rollouts, evaluations and updates allocate
from different threads kept the freed space of each apart: a SmolLM2 run on `orders` held 2 to 3 GB more
after each evaluation than before it, even with the engine's caches dropped, and reached 17 to 20 GB.
`malloc_trim` returns the free pages of every arena at once (docs/engines.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        library = ctypes.CDLL(name)
    except OSError:
        return None
    trim: Callable[[int], int] | None = getattr(library, "malloc_trim", None)
    return trim


def give_back_freed() -> bool:
    """Return the pages the C allocator holds free, in every arena, to the system; False where the C
    library cannot (the memory then stays with the process, for its later allocations)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


__all__ = ["give_back_freed"]
