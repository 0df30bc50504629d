"""What a skill is to the executor (a contract plus `invoke`), and the one result shape of every call."""

from __future__ import annotations

import abc
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sessionrl.skills.clock import Clock
from sessionrl.skills.contract import SkillContract

Json = dict[str, Any]
"""A JSON object: what a skill is called with."""

JsonValue = Any
"""Any JSON value (object, array, string, number, boolean or null): what a skill may answer. The executor
refuses anything else (`INVALID_OUTPUT`), so every answer it passes on survives a JSON round trip."""


class Skill(abc.ABC):
    """An implementation bound to a contract.

    `invoke` gets parameters that already passed the contract's input schema (defaults filled) and returns
    the success payload (any JSON value, checked against the contract's output schema), or raises
    `SkillError(code, message)`. Anything else it raises becomes `INTERNAL`. Timeouts, retries, limits
    and breakers are the executor's job, not the skill's.
    """

    def __init__(self, contract: SkillContract) -> None:
        self.contract = contract

    @property
    def name(self) -> str:
        """The contract's name."""
        return self.contract.name

    @abc.abstractmethod
    async def invoke(self, params: Json, clock: Clock) -> JsonValue:
        """Run one call. `clock` is the executor's: a skill that simulates time sleeps on it."""

    async def aclose(self) -> None:
        """Release what the skill holds open (connections, server processes). Safe to call twice."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class SkillResult(BaseModel):
    """How one executor call ended. Failures are results too: the executor never raises for them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    skill: str = Field(description="Name of the skill that served the call (the fallback, if one did).")
    status: Literal["success", "error"]
    output: JsonValue = Field(
        default=None, description="The success payload: any JSON value (None on error)."
    )
    error_code: str | None = None
    error_message: str | None = None
    retryable: bool = Field(default=False, description="Whether the same call may succeed later.")
    latency_ms: float = Field(default=0.0, ge=0, description="Whole call on the executor's clock.")
    attempts: int = Field(default=0, ge=0, description="Attempts made (0: unknown skill or bad parameters).")
    warnings: tuple[str, ...] = Field(default=(), description="Clipped parameters, a failed primary, ...")
    fallback_from: str | None = Field(default=None, description="The primary skill when a fallback served.")

    @property
    def ok(self) -> bool:
        """True for a success."""
        return self.status == "success"
