"""A circuit breaker per skill: stop calling a skill whose recent calls mostly fail, then probe it.

States: `closed` (calls pass; the last `window` outcomes are kept), `open` (calls are refused until
`cooldown_s` has passed on the clock), `half_open` (exactly one probe call passes; its success closes the
breaker with a clean window, its failure opens it again for another cool-down).
"""

from __future__ import annotations

from collections import deque
from enum import StrEnum

from sessionrl.skills.clock import Clock
from sessionrl.skills.contract import BreakerPolicy


class BreakerState(StrEnum):
    """Where a breaker stands."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Permit(StrEnum):
    """What kind of call the breaker let through; hand it back to `record`."""

    CALL = "call"
    PROBE = "probe"


class CircuitBreaker:
    """Failure-rate breaker over a sliding window of the most recent calls.

    >>> from sessionrl.skills.clock import ManualClock
    >>> clock = ManualClock()
    >>> breaker = CircuitBreaker(BreakerPolicy(failure_rate=0.5, window=4, min_calls=2, cooldown_s=10), clock)
    >>> for ok in (False, False):
    ...     breaker.record(breaker.allow(), ok=ok)
    >>> breaker.state, breaker.allow()
    (<BreakerState.OPEN: 'open'>, None)
    >>> clock.advance(10)
    >>> breaker.allow()
    <Permit.PROBE: 'probe'>
    """

    def __init__(self, policy: BreakerPolicy, clock: Clock) -> None:
        self._policy = policy
        self._clock = clock
        self._outcomes: deque[bool] = deque(maxlen=policy.window)
        self._opened_at: float | None = None
        self._probing = False

    @property
    def state(self) -> BreakerState:
        """The state now (an open breaker whose cool-down has passed reads as half-open)."""
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._probing or self._clock.now() - self._opened_at >= self._policy.cooldown_s:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    @property
    def available(self) -> bool:
        """Whether a call made now would be let through."""
        state = self.state
        return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and not self._probing)

    @property
    def failure_rate(self) -> float:
        """Share of failures among the calls in the window (0 when empty)."""
        return self._outcomes.count(False) / len(self._outcomes) if self._outcomes else 0.0

    def allow(self) -> Permit | None:
        """Let a call through (and say whether it is the half-open probe), or None to refuse it."""
        state = self.state
        if state is BreakerState.CLOSED:
            return Permit.CALL
        if state is BreakerState.HALF_OPEN and not self._probing:
            self._probing = True
            return Permit.PROBE
        return None

    def record(self, permit: Permit | None, ok: bool | None) -> None:
        """Report how a permitted call ended: `ok` True/False, or None when it was abandoned (cancelled)."""
        if permit is Permit.PROBE:
            self._probing = False
            if ok is True:
                self._opened_at = None
                self._outcomes.clear()
            elif ok is False:
                self._opened_at = self._clock.now()
            return
        if permit is None or ok is None or self._opened_at is not None:
            return
        self._outcomes.append(ok)
        policy = self._policy
        if len(self._outcomes) >= policy.min_calls and self.failure_rate >= policy.failure_rate:
            self._opened_at = self._clock.now()
