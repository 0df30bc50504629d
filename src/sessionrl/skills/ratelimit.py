"""A token bucket per skill, on an injectable clock.

aiolimiter's bucket reads the event loop's own time, which a test cannot move; this one reads a `Clock`,
so a test with a `ManualClock` sees exactly how long the limit made each call wait.
"""

from __future__ import annotations

import asyncio

from sessionrl.skills.clock import Clock
from sessionrl.skills.contract import RateLimit
from sessionrl.skills.errors import ErrorCode, SkillError


class TokenBucket:
    """Up to `max_calls` at once, refilled at `max_calls / period_s` tokens per second; waiters queue FIFO.

    >>> from sessionrl.skills.clock import ManualClock
    >>> import asyncio
    >>> clock = ManualClock()
    >>> bucket = TokenBucket(RateLimit(max_calls=2, period_s=1.0), clock)
    >>> async def take(n):
    ...     return [await bucket.acquire(max_wait_s=5) for _ in range(n)]
    >>> asyncio.run(take(3))  # the third waits for one token: 1 / (2 per s) = 0.5 s
    [0.0, 0.0, 0.5]
    """

    def __init__(self, limit: RateLimit, clock: Clock) -> None:
        self._capacity = float(limit.max_calls)
        self._rate = limit.max_calls / limit.period_s
        self._clock = clock
        self._tokens = self._capacity
        self._stamp = clock.now()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock.now()
        self._tokens = min(self._capacity, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now

    async def acquire(self, max_wait_s: float) -> float:
        """Take one token, waiting on the clock if needed; returns the wait in seconds.

        Raises `SkillError(RATE_LIMITED)` at once, without waiting, when the wait would exceed `max_wait_s`.
        """
        async with self._lock:
            self._refill()
            wait = max(0.0, (1.0 - self._tokens) / self._rate)
            if wait > max_wait_s:
                raise SkillError(
                    ErrorCode.RATE_LIMITED,
                    f"the rate limit needs a {wait:.3g} s wait, over {max_wait_s:.3g} s",
                )
            if wait > 0:
                await self._clock.sleep(wait)
                self._refill()
            self._tokens -= 1.0
            return wait
