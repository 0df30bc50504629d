"""Skill contracts: what a skill accepts, returns, promises (SLA) and risks, read from YAML.

A contract is the single description of a skill shared by the executor (validation, timeouts, limits,
breaker, fallback), the policy (tool schemas, parameter ranges, masks), the reward shaper (SLA, risk) and
the simulator (latency and failure profile). It exports to an OpenAI tool schema and an MCP tool.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sessionrl.skills.errors import STANDARD_RETRYABLE, ContractError
from sessionrl.skills.schema import object_schema_problems, schema_problems

# a contract's risk is on the wire too (the service lists skills with it), so it is defined there
from sessionrl.wire import RiskLevel as RiskLevel

Json = dict[str, Any]
NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
CODE_PATTERN = r"^[A-Z][A-Z0-9_]*$"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorSpec(_Frozen):
    """One error code a skill may fail with."""

    retryable: bool = Field(description="Whether calling again with the same parameters may succeed.")
    description: str = Field(default="", description="When the skill fails with this code.")


class RateLimit(_Frozen):
    """A token bucket: at most `max_calls` in a burst, refilled at `max_calls / period_s` per second."""

    max_calls: int = Field(ge=1, description="Bucket size: calls allowed at once after a quiet period.")
    period_s: float = Field(gt=0, description="Seconds to refill the whole bucket.")


class BreakerPolicy(_Frozen):
    """When the circuit breaker opens (failure share over the last calls) and how long it stays open."""

    failure_rate: float = Field(default=0.5, gt=0, le=1, description="Open at this share of failed calls.")
    window: int = Field(default=20, ge=1, description="How many of the most recent calls are counted.")
    min_calls: int = Field(default=5, ge=1, description="Calls needed in the window before it may open.")
    cooldown_s: float = Field(default=30.0, gt=0, description="Seconds open before one probe is let through.")

    @model_validator(mode="after")
    def _min_calls_fit(self) -> BreakerPolicy:
        if self.min_calls > self.window:
            raise ValueError(f"min_calls ({self.min_calls}) cannot exceed window ({self.window})")
        return self


class Sla(_Frozen):
    """What the skill promises and how hard the executor may lean on it."""

    timeout_s: float = Field(default=10.0, gt=0, description="A call running longer fails with TIMEOUT.")
    p95_ms: float | None = Field(default=None, gt=0, description="Latency budget for the 95th percentile.")
    rate_limit: RateLimit | None = Field(default=None, description="Token bucket per skill; none: no limit.")
    max_concurrency: int | None = Field(default=None, ge=1, description="Calls in flight at once; none: any.")
    breaker: BreakerPolicy = Field(default_factory=BreakerPolicy, description="Circuit breaker policy.")


class SimulationProfile(_Frozen):
    """How a simulated stand-in behaves: log-normal latency with this mean/std, and random failures."""

    mean_ms: float = Field(ge=0, description="Mean latency in milliseconds.")
    std_ms: float = Field(default=0.0, ge=0, description="Standard deviation of the latency.")
    fail_rate: float = Field(default=0.0, ge=0, le=1, description="Probability that a call fails.")
    fail_codes: tuple[str, ...] = Field(default=(), description="Codes drawn uniformly for a failure.")


class SkillContract(_Frozen):
    """A skill's contract. Build it with `load_contract(path)` or `SkillContract.model_validate(mapping)`."""

    name: str = Field(pattern=NAME_PATTERN, description="Tool name: letters, digits, `_` and `-`, ≤ 64.")
    description: str = Field(min_length=1, description="What the skill does, written for the model.")
    input_schema: Json = Field(description="JSON Schema (2020-12) of the parameters; `type: object`.")
    output_schema: Json = Field(
        default_factory=dict,
        description="JSON Schema of a success payload, which may be any JSON value; none: anything.",
    )
    errors: dict[str, ErrorSpec] = Field(default_factory=dict, description="The skill's own error codes.")
    sla: Sla = Field(default_factory=Sla, description="Timeout, latency budget, limits and breaker.")
    risk: RiskLevel = Field(default=RiskLevel.LOW, description="Harm a wrong call can do.")
    fallback: str | None = Field(default=None, description="Skill that serves the call when this one fails.")
    simulation: SimulationProfile | None = Field(
        default=None, description="Profile for a simulated stand-in."
    )
    examples: tuple[Json, ...] = Field(default=(), description="Valid parameter sets, used by check_skill.")

    @field_validator("input_schema")
    @classmethod
    def _usable_input_schema(cls, schema: Json) -> Json:
        problem = object_schema_problems(schema)
        if problem is not None:
            raise ValueError(problem)
        return schema

    @field_validator("output_schema")
    @classmethod
    def _usable_output_schema(cls, schema: Json) -> Json:
        problem = schema_problems(schema)
        if problem is not None:
            raise ValueError(problem)
        return schema

    @field_validator("errors")
    @classmethod
    def _code_names(cls, errors: dict[str, ErrorSpec]) -> dict[str, ErrorSpec]:
        bad = [code for code in errors if not _is_code(code)]
        if bad:
            raise ValueError(f"error codes must be UPPER_SNAKE_CASE (like LAB_UNAVAILABLE), got {bad}")
        return errors

    @model_validator(mode="after")
    def _references(self) -> SkillContract:
        if self.fallback == self.name:
            raise ValueError(
                f"fallback of {self.name!r} names the skill itself; name another skill or drop it"
            )
        if self.simulation is not None:
            unknown = [c for c in self.simulation.fail_codes if not self.knows_code(c)]
            if unknown:
                raise ValueError(
                    f"simulation.fail_codes {unknown} are neither standard codes nor declared under `errors`"
                )
        return self

    def knows_code(self, code: str) -> bool:
        """True when `code` is a standard code or one this contract declares."""
        return code in self.errors or code in STANDARD_RETRYABLE

    def is_retryable(self, code: str) -> bool:
        """Whether the executor retries `code`: the contract's word first, then the standard table."""
        if code in self.errors:
            return self.errors[code].retryable
        return STANDARD_RETRYABLE.get(code, False)

    def to_openai_tool(self) -> Json:
        """The contract as an OpenAI function tool (`{"type": "function", "function": {...}}`)."""
        function = {"name": self.name, "description": self.description, "parameters": self.input_schema}
        return {"type": "function", "function": function}

    def to_mcp_tool(self) -> Json:
        """The contract as an MCP tool description (the `tools/list` entry, camelCase keys).

        MCP's `outputSchema` describes structured content, which is always an object, so it is given only
        for an output schema of `type: object`; other outputs travel as text.
        """
        tool = {"name": self.name, "description": self.description, "inputSchema": self.input_schema}
        if self.output_schema.get("type") == "object":
            tool["outputSchema"] = self.output_schema
        return tool


def _is_code(code: str) -> bool:
    return re.fullmatch(CODE_PATTERN, code) is not None


def load_contract(path: str | Path) -> SkillContract:
    """Read one contract from a YAML file; raises `ContractError` naming the file, field and rule."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ContractError(f"{path}: cannot read the contract: {error}") from error
    return parse_contract(data, source=str(path))


def parse_contract(data: object, source: str = "contract") -> SkillContract:
    """Validate a mapping into a contract; raises `ContractError` with one line per problem."""
    if not isinstance(data, dict):
        raise ContractError(f"{source}: a contract must be a mapping of fields, got {type(data).__name__}")
    try:
        return SkillContract.model_validate(data)
    except ValidationError as error:
        lines = [
            f"  {'.'.join(str(p) for p in e['loc']) or '(contract)'}: {e['msg']}" for e in error.errors()
        ]
        raise ContractError(f"{source}: invalid skill contract\n" + "\n".join(lines)) from None


def load_contracts(paths: str | Path | Iterable[str | Path]) -> dict[str, SkillContract]:
    """Contracts by name from a folder (every `*.yaml`/`*.yml`, sorted) or from a list of files."""
    if isinstance(paths, str | Path):
        folder = Path(paths)
        if not folder.is_dir():
            raise ContractError(f"{folder}: not a folder of contracts")
        paths = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    contracts: dict[str, SkillContract] = {}
    for path in paths:
        contract = load_contract(path)
        if contract.name in contracts:
            raise ContractError(f"{path}: a second contract is named {contract.name!r}; names must be unique")
        contracts[contract.name] = contract
    return contracts
