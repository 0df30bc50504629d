"""Error codes every skill shares, and the exception a skill raises to fail a call.

A contract declares its own codes (with `retryable`) on top of the standard ones below; the executor looks
a code up in the contract first and in `STANDARD_RETRYABLE` second, so a contract may, for example, make
`TIMEOUT` non-retryable for a skill that must never run twice.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from sessionrl.errors import SessionRLError


class ErrorCode(StrEnum):
    """Codes the executor, the bindings and the sandbox produce themselves."""

    INVALID_PARAMS = "INVALID_PARAMS"
    """The parameters do not satisfy the contract's input schema."""
    INVALID_OUTPUT = "INVALID_OUTPUT"
    """The skill answered with a payload that does not satisfy the contract's output schema."""
    TIMEOUT = "TIMEOUT"
    """The call did not finish within the contract's timeout."""
    BREAKER_OPEN = "BREAKER_OPEN"
    """The skill's circuit breaker is open: the call was refused without running."""
    RATE_LIMITED = "RATE_LIMITED"
    """The skill's rate limit would have delayed the call past its timeout."""
    UNKNOWN_SKILL = "UNKNOWN_SKILL"
    """No skill of that name is registered."""
    UNAVAILABLE = "UNAVAILABLE"
    """The skill's backend could not be reached or said it is overloaded (HTTP 502/503, lost connection)."""
    INTERNAL = "INTERNAL"
    """The skill failed in a way its contract does not name."""
    SANDBOX_TIMEOUT = "SANDBOX_TIMEOUT"
    """A sandboxed skill ran past its wall-clock limit and was killed."""
    SANDBOX_CPU = "SANDBOX_CPU"
    """A sandboxed skill used up its CPU-seconds limit and was killed."""
    SANDBOX_MEMORY = "SANDBOX_MEMORY"
    """A sandboxed skill tried to allocate past its address-space limit."""
    SANDBOX_CRASH = "SANDBOX_CRASH"
    """A sandboxed skill died from a signal (segfault, abort) or without answering."""


STANDARD_RETRYABLE: Final[dict[str, bool]] = {
    ErrorCode.INVALID_PARAMS: False,
    ErrorCode.INVALID_OUTPUT: False,
    ErrorCode.TIMEOUT: True,
    ErrorCode.BREAKER_OPEN: False,
    ErrorCode.RATE_LIMITED: True,
    ErrorCode.UNKNOWN_SKILL: False,
    ErrorCode.UNAVAILABLE: True,
    ErrorCode.INTERNAL: False,
    ErrorCode.SANDBOX_TIMEOUT: False,
    ErrorCode.SANDBOX_CPU: False,
    ErrorCode.SANDBOX_MEMORY: False,
    ErrorCode.SANDBOX_CRASH: False,
}
"""Whether the executor retries each standard code when the contract does not say otherwise."""

NOT_SKILL_FAULTS: Final = frozenset(
    {ErrorCode.INVALID_PARAMS, ErrorCode.BREAKER_OPEN, ErrorCode.RATE_LIMITED, ErrorCode.UNKNOWN_SKILL}
)
"""Codes that say nothing about the skill's health (caller's mistake or the executor's own refusal):
they never count against the circuit breaker."""


class SkillError(SessionRLError):
    """Raised by a skill implementation to fail a call with `code` (a standard or contract code).

    >>> error = SkillError("PATIENT_NOT_FOUND", "no patient p9")
    >>> error.code, str(error)
    ('PATIENT_NOT_FOUND', 'PATIENT_NOT_FOUND: no patient p9')
    """

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = str(code)
        self.message = message


class ContractError(SessionRLError, ValueError):
    """A skill contract is malformed; the message names the file (if any), the field and the fix."""


class SkillCheckError(SessionRLError):
    """`check_skill` found a contract or implementation that cannot work; the message says how to fix it."""
