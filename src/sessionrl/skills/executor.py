"""The skill executor: every call validated, limited, timed, retried, guarded by a breaker, with fallback.

One call to `SkillExecutor.call` goes:
1. look the skill up (`UNKNOWN_SKILL`), fill defaults, clip if configured, validate (`INVALID_PARAMS`);
2. attempts: a plain first one, then, after a retryable failure only, a tenacity loop for the rest
   (exponential backoff with seeded jitter, slept on the clock). Each attempt is a breaker check
   (`BREAKER_OPEN`), token bucket (`RATE_LIMITED` when the wait would pass the timeout), concurrency
   slot, the skill itself under the contract's timeout (`TIMEOUT`), output validation (`INVALID_OUTPUT`:
   the output must be a JSON value, of any kind, and satisfy the contract's output schema); each
   attempt's outcome feeds the breaker;
3. if it still failed (for any reason but bad parameters) and the contract names a fallback, the fallback
   runs the same way and the result says so.
Every outcome is a `SkillResult`; the executor never raises for a skill's failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from sessionrl.skills.breaker import BreakerState, CircuitBreaker
from sessionrl.skills.clock import Clock, SystemClock
from sessionrl.skills.contract import SkillContract
from sessionrl.skills.errors import NOT_SKILL_FAULTS, ErrorCode, SkillError
from sessionrl.skills.ratelimit import TokenBucket
from sessionrl.skills.schema import (
    SchemaValidator,
    clip_numbers,
    fill_defaults,
    json_problem,
    validation_errors,
    validator_for,
)
from sessionrl.skills.skill import JsonValue, Skill, SkillResult
from sessionrl.skills.stats import SkillStats, StatsRecorder

Json = dict[str, Any]


class ExecutorConfig(BaseModel):
    """How the executor treats every skill it serves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    clip: bool = Field(default=False, description="Move out-of-range numbers to the bound (with a warning).")
    time_factor: float = Field(
        default=1.0, gt=0, description="Wall seconds per contract second (simulation)."
    )
    seed: int = Field(default=0, description="Seeds the backoff jitter.")
    max_attempts: int = Field(default=3, ge=1, description="Attempts per skill, first one included.")
    backoff_initial_s: float = Field(default=0.1, ge=0, description="Backoff before the second attempt.")
    backoff_max_s: float = Field(default=2.0, ge=0, description="Backoff never grows past this.")
    jitter_s: float = Field(default=0.1, ge=0, description="Uniform random extra backoff, up to this.")


@dataclass
class _Slot:
    """Everything the executor keeps for one skill."""

    skill: Skill
    params: SchemaValidator
    output: SchemaValidator
    breaker: CircuitBreaker
    bucket: TokenBucket | None
    concurrency: asyncio.Semaphore | None
    stats: StatsRecorder

    @property
    def contract(self) -> SkillContract:
        return self.skill.contract


class SkillExecutor:
    """Runs skills by name under their contracts. Use as `async with` (or call `aclose`) to free them."""

    def __init__(
        self, skills: Iterable[Skill], config: ExecutorConfig | None = None, *, clock: Clock | None = None
    ) -> None:
        self.config = config or ExecutorConfig()
        self.clock: Clock = clock or SystemClock(self.config.time_factor)
        self._rng = random.Random(self.config.seed)
        self._slots: dict[str, _Slot] = {}
        for skill in skills:
            if skill.name in self._slots:
                raise ValueError(f"two skills are named {skill.name!r}; skill names must be unique")
            self._slots[skill.name] = self._build_slot(skill)
        for slot in self._slots.values():
            fallback = slot.contract.fallback
            if fallback is not None and fallback not in self._slots:
                raise ValueError(f"skill {slot.skill.name!r} falls back to {fallback!r}, which is not given")

    def _build_slot(self, skill: Skill) -> _Slot:
        sla = skill.contract.sla
        return _Slot(
            skill=skill,
            params=validator_for(skill.contract.input_schema),
            output=validator_for(skill.contract.output_schema),
            breaker=CircuitBreaker(sla.breaker, self.clock),
            bucket=TokenBucket(sla.rate_limit, self.clock) if sla.rate_limit else None,
            concurrency=asyncio.Semaphore(sla.max_concurrency) if sla.max_concurrency else None,
            stats=StatsRecorder(),
        )

    @property
    def contracts(self) -> dict[str, SkillContract]:
        """Contracts of every skill, by name."""
        return {name: slot.contract for name, slot in self._slots.items()}

    def masked(self) -> frozenset[str]:
        """Skills a policy should not pick now: their breaker would refuse a call."""
        return frozenset(name for name, slot in self._slots.items() if not slot.breaker.available)

    def breaker_state(self, name: str) -> BreakerState:
        """The breaker state of skill `name` (KeyError when unknown)."""
        return self._slots[name].breaker.state

    def stats(self, name: str) -> SkillStats:
        """Counters and latency percentiles of skill `name` (KeyError when unknown)."""
        slot = self._slots[name]
        return slot.stats.snapshot(name, slot.breaker.state)

    async def call(self, name: str, params: Mapping[str, Any]) -> SkillResult:
        """Run skill `name` with `params`; every outcome, failure included, is a `SkillResult`."""
        started = self.clock.now()
        slot = self._slots.get(name)
        if slot is None:
            known = ", ".join(sorted(self._slots)) or "none"
            error = SkillError(ErrorCode.UNKNOWN_SKILL, f"no skill named {name!r} (known: {known})")
            return self._error_result(name, error, attempts=0, started=started)
        result = await self._serve(slot, dict(params))
        fallback = slot.contract.fallback
        if result.ok or fallback is None or result.error_code == ErrorCode.INVALID_PARAMS:
            return result
        served = await self._serve(self._slots[fallback], dict(params))
        note = f"{name} failed with {result.error_code}: {result.error_message}"
        return served.model_copy(
            update={
                "fallback_from": name,
                "warnings": (*result.warnings, note, *served.warnings),
                "latency_ms": (self.clock.now() - started) * 1000.0,
            }
        )

    async def _serve(self, slot: _Slot, params: Json) -> SkillResult:
        """Validate, then run with retries; records the outcome (this skill's own latency) in its stats."""
        started = self.clock.now()
        name = slot.skill.name
        prepared, warnings = self._prepare(slot, params)
        outcome, attempts = (
            (prepared, 0) if isinstance(prepared, SkillError) else await self._run(slot, prepared)
        )
        if isinstance(outcome, SkillError):
            result = self._error_result(name, outcome, attempts, started, warnings)
        else:
            latency_ms = (self.clock.now() - started) * 1000.0
            result = SkillResult(
                skill=name,
                status="success",
                output=outcome,
                latency_ms=latency_ms,
                attempts=attempts,
                warnings=warnings,
            )
        slot.stats.record(result)
        return result

    def _prepare(self, slot: _Slot, params: Json) -> tuple[Json | SkillError, tuple[str, ...]]:
        """Defaults, optional clipping, validation: the parameters to run with, or the error."""
        schema = slot.contract.input_schema
        params = fill_defaults(schema, params)
        warnings: tuple[str, ...] = ()
        if self.config.clip:
            params, warnings = clip_numbers(schema, params)
        problems = validation_errors(slot.params, params)
        if problems:
            return SkillError(ErrorCode.INVALID_PARAMS, "; ".join(problems)), warnings
        return params, warnings

    async def _run(self, slot: _Slot, params: Json) -> tuple[JsonValue | SkillError, int]:
        """Attempt until success, a non-retryable error or `max_attempts`; returns outcome and attempts.

        The first attempt is a plain call: most calls succeed at once, and they should not pay for the
        retry machinery. Only a retryable failure enters tenacity, for the attempts that remain.
        """
        try:
            return await self._attempt(slot, params), 1
        except SkillError as error:
            if self.config.max_attempts == 1 or not slot.contract.is_retryable(error.code):
                return error, 1
        await self.clock.sleep(self._backoff(1))
        attempts = 1
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.config.max_attempts - 1),
            wait=lambda state: self._backoff(state.attempt_number + 1),
            retry=retry_if_exception(
                lambda e: isinstance(e, SkillError) and slot.contract.is_retryable(e.code)
            ),
            sleep=self.clock.sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    output = await self._attempt(slot, params)
        except SkillError as error:
            return error, attempts
        return output, attempts

    def _backoff(self, attempt: int) -> float:
        """Backoff after attempt `attempt` (1-based): min(max, initial · 2^(attempt-1)) plus jitter."""
        config = self.config
        base = min(config.backoff_max_s, config.backoff_initial_s * 2 ** (attempt - 1))
        return float(base) + self._rng.uniform(0.0, config.jitter_s)

    async def _attempt(self, slot: _Slot, params: Json) -> JsonValue:
        """One run of the skill behind the breaker, the rate limit and the concurrency cap."""
        contract = slot.contract
        if not slot.breaker.available:
            raise _breaker_open(slot)
        if slot.bucket is not None:
            await slot.bucket.acquire(max_wait_s=contract.sla.timeout_s)
        async with slot.concurrency or contextlib.nullcontext():
            permit = slot.breaker.allow()
            if permit is None:
                raise _breaker_open(slot)
            ok: bool | None = None
            try:
                output = await self._timed_invoke(slot, params)
                ok = True
                return output
            except SkillError as error:
                ok = None if error.code in NOT_SKILL_FAULTS else False
                raise
            finally:
                slot.breaker.record(permit, ok)

    async def _timed_invoke(self, slot: _Slot, params: Json) -> JsonValue:
        """The skill under its timeout (on the wall, scaled by `time_factor`, and on the clock)."""
        timeout_s = slot.contract.sla.timeout_s
        started = self.clock.now()
        try:
            async with asyncio.timeout(timeout_s * self.config.time_factor):
                output = await slot.skill.invoke(params, self.clock)
        except SkillError:
            raise
        except TimeoutError:
            raise SkillError(ErrorCode.TIMEOUT, f"no answer within {timeout_s} s") from None
        except Exception as error:
            raise SkillError(ErrorCode.INTERNAL, f"{type(error).__name__}: {error}") from error
        if self.clock.now() - started > timeout_s:
            raise SkillError(ErrorCode.TIMEOUT, f"answered after the {timeout_s} s timeout")
        problem = json_problem(output)
        if problem is not None:
            raise SkillError(ErrorCode.INVALID_OUTPUT, problem)
        problems = validation_errors(slot.output, output, root="output")
        if problems:
            raise SkillError(ErrorCode.INVALID_OUTPUT, "; ".join(problems))
        return output

    def _error_result(
        self, name: str, error: SkillError, attempts: int, started: float, warnings: tuple[str, ...] = ()
    ) -> SkillResult:
        slot = self._slots.get(name)
        retryable = slot.contract.is_retryable(error.code) if slot else False
        return SkillResult(
            skill=name,
            status="error",
            error_code=error.code,
            error_message=error.message,
            retryable=retryable,
            latency_ms=(self.clock.now() - started) * 1000.0,
            attempts=attempts,
            warnings=warnings,
        )

    async def aclose(self) -> None:
        """Close every skill (connections, server processes)."""
        for slot in self._slots.values():
            await slot.skill.aclose()

    async def __aenter__(self) -> SkillExecutor:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _breaker_open(slot: _Slot) -> SkillError:
    return SkillError(
        ErrorCode.BREAKER_OPEN,
        f"{slot.skill.name} is failing ({slot.breaker.failure_rate:.0%} of recent calls); calls are paused",
    )
