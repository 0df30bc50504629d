"""Clocks in contract seconds: the executor's breakers, rate limits, backoff and latencies read one.

`SystemClock(time_factor)` runs contract time `1 / time_factor` times faster than the wall, so a simulated
300 ms latency takes 3 ms of wall time at `time_factor=0.01` and still reads as 300 ms. The process's own
overhead is scaled up the same way: at `time_factor=1e-5` each 10 us of event-loop work reads as a second,
enough to break a contract's timeout. Below about 1e-3, use `ManualClock`, which only moves when told to (or
when something sleeps on it); it also makes breaker cool-downs and rate limits testable without waiting.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """A source of monotonic time in seconds, and a way to wait on it."""

    def now(self) -> float:
        """Seconds since an arbitrary start; never goes backwards."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's time."""
        ...


class SystemClock:
    """The monotonic wall clock, sped up by `1 / time_factor`.

    >>> SystemClock(0.5).time_factor
    0.5
    """

    def __init__(self, time_factor: float = 1.0) -> None:
        if time_factor <= 0:
            raise ValueError(f"time_factor must be positive, got {time_factor}")
        self.time_factor = time_factor

    def now(self) -> float:
        """Contract seconds: wall seconds divided by `time_factor`."""
        return time.monotonic() / self.time_factor

    async def sleep(self, seconds: float) -> None:
        """Sleep `seconds * time_factor` wall seconds."""
        await asyncio.sleep(max(seconds, 0.0) * self.time_factor)


class ManualClock:
    """A clock for tests: `advance` moves it, and `sleep` moves it by the slept time at once.

    Meant for sequential tests: concurrent sleepers each add their own time.

    >>> clock = ManualClock()
    >>> clock.advance(2.5)
    >>> clock.now()
    2.5
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        """The current manual time."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the time forward by `seconds`."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards ({seconds} s)")
        self._now += seconds

    async def sleep(self, seconds: float) -> None:
        """Advance by `seconds`, then let other tasks run once."""
        self.advance(max(seconds, 0.0))
        await asyncio.sleep(0)
