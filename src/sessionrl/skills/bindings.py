"""In-process skills: a Python callable, and a simulated stand-in driven by the contract's profile."""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any

from sessionrl.skills.clock import Clock
from sessionrl.skills.contract import SimulationProfile, SkillContract
from sessionrl.skills.errors import ContractError, ErrorCode, SkillError
from sessionrl.skills.schema import sample_instance
from sessionrl.skills.skill import JsonValue, Skill

Json = dict[str, Any]
SkillFunction = Callable[[Json], JsonValue | Awaitable[JsonValue]]


class CallableSkill(Skill):
    """A skill served by `fn(params)`, sync or async. See `callable_skill`."""

    def __init__(self, contract: SkillContract, fn: SkillFunction, *, blocking: bool = False) -> None:
        super().__init__(contract)
        self._fn = fn
        self._blocking = blocking

    async def invoke(self, params: Json, clock: Clock) -> JsonValue:
        """Call the function; await what it returns when that is awaitable."""
        result = await asyncio.to_thread(self._fn, params) if self._blocking else self._fn(params)
        if inspect.isawaitable(result):
            return await result
        return result


def callable_skill(contract: SkillContract, fn: SkillFunction, *, blocking: bool = False) -> CallableSkill:
    """Bind `fn(params) -> JSON value` (or an async function) to `contract`; raise `SkillError` to fail.

    A sync function runs on the event loop, so it must be quick. Pass `blocking=True` for one that waits
    on I/O: it then runs in a worker thread and the executor's timeout can fire while it waits.
    """
    return CallableSkill(contract, fn, blocking=blocking)


class SimulatedSkill(Skill):
    """A stand-in that follows the contract's `simulation` profile. See `simulated_skill`."""

    def __init__(
        self, contract: SkillContract, *, seed: int, output: Callable[[Json], JsonValue] | None
    ) -> None:
        super().__init__(contract)
        if contract.simulation is None:
            raise ContractError(
                f"{contract.name}: a simulated skill needs a `simulation` section in its contract"
            )
        self._profile: SimulationProfile = contract.simulation
        self._output = output
        self._sample: JsonValue = None
        if output is None:
            try:
                self._sample = sample_instance(contract.output_schema)
            except ValueError:
                raise ContractError(
                    f"{contract.name}: cannot build a sample output from output_schema; pass output=fn"
                ) from None
        self._flat = not isinstance(self._sample, list | dict) or (
            isinstance(self._sample, dict)
            and all(isinstance(value, str | int | float | None) for value in self._sample.values())
        )
        """Whether the sample is a scalar or a mapping of scalars, so a shallow copy is a full one."""
        self._seed = seed
        self._rng: random.Random | None = None
        self._draws = self._profile.fail_rate > 0 or self._profile.mean_ms * self._profile.std_ms != 0
        """Whether a call's draws can change what it does: with no failures and a fixed latency they cannot,
        so such a skill never builds (seeds) its generator, which costs more than the rest of a call."""

    def _stream(self) -> random.Random:
        """The skill's generator, seeded at its first draw (the same draws as one seeded up front)."""
        if self._rng is None:
            self._rng = random.Random(self._seed)
        return self._rng

    def draw_latency_ms(self) -> float:
        """One latency draw: log-normal with the profile's mean and standard deviation."""
        mean, std = self._profile.mean_ms, self._profile.std_ms
        if mean == 0 or std == 0:
            return mean
        sigma2 = math.log1p((std / mean) ** 2)
        return self._stream().lognormvariate(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))

    async def invoke(self, params: Json, clock: Clock) -> JsonValue:
        """Sleep a drawn latency on `clock`, then fail with the profile's probability or answer."""
        latency_ms = self.draw_latency_ms()
        fails = self._draws and self._stream().random() < self._profile.fail_rate
        code = self._stream().choice(self._profile.fail_codes) if fails and self._profile.fail_codes else None
        if latency_ms > 0:  # a zero-latency skill answers at once, as an in-process function does
            await clock.sleep(latency_ms / 1000.0)
        if fails:
            raise SkillError(
                code or ErrorCode.INTERNAL, f"simulated failure (fail rate {self._profile.fail_rate})"
            )
        if self._output is not None:
            return self._output(params)
        if not self._flat:
            return copy.deepcopy(self._sample)
        return dict(self._sample) if isinstance(self._sample, dict) else self._sample


def simulated_skill(
    contract: SkillContract, *, seed: int = 0, output: Callable[[Json], JsonValue] | None = None
) -> SimulatedSkill:
    """A seeded stand-in for `contract`: the same seed and call sequence give the same latencies and failures.

    Latency is log-normal with `simulation.mean_ms`/`std_ms` (slept on the executor's clock, so the
    executor's `time_factor` speeds it up); a call fails with probability `fail_rate`, with a code drawn
    from `fail_codes` (`INTERNAL` when none). The answer is `output(params)`, or else the smallest payload
    that satisfies `output_schema` (None when the contract declares none).
    """
    return SimulatedSkill(contract, seed=seed, output=output)
