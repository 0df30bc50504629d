"""`check_skill`: does a contract (and its implementation) hold together? Run it over every skill you ship.

A flat list of small `check_*` functions. Problems that make a skill unusable raise `SkillCheckError`
with a message that says how to fix them; weaker smells come back as warning strings.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sessionrl.skills.clock import SystemClock
from sessionrl.skills.contract import SkillContract, load_contract, parse_contract
from sessionrl.skills.errors import ContractError, SkillCheckError, SkillError
from sessionrl.skills.schema import (
    fill_defaults,
    json_problem,
    sample_instance,
    validation_errors,
    validator_for,
)
from sessionrl.skills.skill import Skill

Json = dict[str, Any]
OPENAI_DESCRIPTION_LIMIT = 1024


def _properties(schema: Json, path: str = "input_schema") -> Iterator[tuple[str, Json]]:
    """Every property schema under `schema`, nested objects and array items included, with its path."""
    for name, sub in schema.get("properties", {}).items():
        if isinstance(sub, dict):
            yield f"{path}.properties.{name}", sub
            yield from _properties(sub, f"{path}.properties.{name}")
    items = schema.get("items")
    if isinstance(items, dict):
        yield from _properties(items, f"{path}.items")


def check_json_serializable(contract: SkillContract) -> None:
    """The contract must survive JSON, because tool schemas travel as JSON."""
    try:
        json.dumps(contract.model_dump(mode="python"))
    except (TypeError, ValueError) as error:
        raise SkillCheckError(
            f"{contract.name}: the contract holds a value JSON cannot carry ({error}); "
            "quote dates and times in the YAML so they stay strings"
        ) from error


def check_defaults(contract: SkillContract) -> None:
    """Every `default` must satisfy the schema it sits in."""
    for path, sub in _properties(contract.input_schema):
        if "default" in sub:
            problems = validation_errors(validator_for(sub), sub["default"], root="default")
            if problems:
                raise SkillCheckError(
                    f"{contract.name}: {path}.default {sub['default']!r} breaks its own schema "
                    f"({'; '.join(problems)}); change the default or the schema"
                )


def check_examples(contract: SkillContract) -> None:
    """Every example (defaults filled) must satisfy the input schema."""
    validator = validator_for(contract.input_schema)
    for index, example in enumerate(contract.examples):
        problems = validation_errors(validator, fill_defaults(contract.input_schema, example))
        if problems:
            raise SkillCheckError(
                f"{contract.name}: examples[{index}] is not valid input ({'; '.join(problems)}); "
                "fix the example"
            )


def check_openai_tool(contract: SkillContract) -> list[str]:
    """The OpenAI export must have the expected shape; long descriptions get cut by some providers."""
    tool = contract.to_openai_tool()
    function = tool.get("function", {})
    if tool.get("type") != "function" or function.get("parameters", {}).get("type") != "object":
        raise SkillCheckError(f"{contract.name}: the OpenAI export lost its function shape: {tool}")
    if len(contract.description) > OPENAI_DESCRIPTION_LIMIT:
        return [f"{contract.name}: description is {len(contract.description)} characters; keep it under 1024"]
    return []


def check_parameter_docs(contract: SkillContract) -> list[str]:
    """Models choose arguments better when each property says what it is."""
    return [
        f"{contract.name}: {path} has no description; add one so a model knows what to pass"
        for path, sub in _properties(contract.input_schema)
        if "description" not in sub
    ]


def check_numeric_bounds(contract: SkillContract) -> list[str]:
    """Clipping and bounded parameter heads need a minimum and a maximum on every number."""
    return [
        f"{contract.name}: {path} has no minimum/maximum; clipping and bounded policies cannot range it"
        for path, sub in _properties(contract.input_schema)
        if sub.get("type") in ("number", "integer")
        and not ({"minimum", "maximum"} <= sub.keys() or "enum" in sub)
    ]


def check_sla(contract: SkillContract) -> list[str]:
    """The latency budget and the simulated latency should fit inside the timeout."""
    sla, warnings = contract.sla, []
    timeout_ms = sla.timeout_s * 1000
    if sla.p95_ms is not None and sla.p95_ms > timeout_ms:
        warnings.append(f"{contract.name}: sla.p95_ms {sla.p95_ms} exceeds the {timeout_ms:g} ms timeout")
    if contract.simulation is not None and contract.simulation.mean_ms >= timeout_ms:
        warnings.append(
            f"{contract.name}: simulation.mean_ms reaches the timeout; most simulated calls time out"
        )
    return warnings


def check_binding(contract: SkillContract, impl: Skill) -> None:
    """The implementation must be bound to this very contract."""
    if impl.contract != contract:
        raise SkillCheckError(
            f"{contract.name}: the implementation is bound to contract {impl.contract.name!r}, or to another "
            "version of it; build it from the contract being checked"
        )


def check_fallback(contract: SkillContract, fallback: SkillContract) -> None:
    """The fallback must be the one named, and accept every example of the skill it stands in for."""
    if contract.fallback != fallback.name:
        raise SkillCheckError(
            f"{contract.name}: its fallback is {contract.fallback!r}, not {fallback.name!r}"
        )
    validator = validator_for(fallback.input_schema)
    for index, example in enumerate(contract.examples):
        problems = validation_errors(validator, fill_defaults(fallback.input_schema, example))
        if problems:
            raise SkillCheckError(
                f"{contract.name}: fallback {fallback.name} rejects examples[{index}] "
                f"({'; '.join(problems)}); it receives the same parameters, so its schema must accept them"
            )


async def check_calls(contract: SkillContract, impl: Skill) -> list[str]:
    """Run the implementation on each example (or a sample input) and hold its answers to the contract."""
    inputs = list(contract.examples)
    if not inputs:
        try:
            inputs = [sample_instance(contract.input_schema)]
        except ValueError:
            return [f"{contract.name}: no examples and no sample input; add `examples` to exercise the skill"]
    output_validator, warnings = validator_for(contract.output_schema), []
    for index, params in enumerate(inputs):
        where = f"{contract.name}: input {index} ({params})"
        try:
            async with asyncio.timeout(contract.sla.timeout_s):
                output = await impl.invoke(fill_defaults(contract.input_schema, params), SystemClock())
        except SkillError as error:
            if not contract.knows_code(error.code):
                raise SkillCheckError(
                    f"{where} failed with undeclared code {error.code!r}; "
                    "declare it under `errors` with `retryable`"
                ) from error
            warnings.append(f"{where} failed with {error.code}: {error.message}")
            continue
        except TimeoutError:
            warnings.append(f"{where} took longer than the {contract.sla.timeout_s} s timeout")
            continue
        except Exception as error:
            raise SkillCheckError(
                f"{where} raised {type(error).__name__}: {error}; "
                "raise SkillError(code, message) for expected failures"
            ) from error
        problem = json_problem(output)
        if problem is not None:
            raise SkillCheckError(f"{where} answered with something that is not JSON: {problem}")
        problems = validation_errors(output_validator, output, root="output")
        if problems:
            raise SkillCheckError(f"{where} answered against output_schema: {'; '.join(problems)}")
    return warnings


async def check_skill(
    contract: SkillContract | Mapping[str, Any] | str | Path, impl: Skill | None = None
) -> tuple[str, ...]:
    """Check a contract (a model, a mapping or a YAML path) and, when given, an implementation of it.

    Raises `SkillCheckError` for what must be fixed; returns warnings for what should be.
    """
    try:
        if isinstance(contract, str | Path):
            contract = load_contract(contract)
        elif not isinstance(contract, SkillContract):
            contract = parse_contract(dict(contract))
    except ContractError as error:
        raise SkillCheckError(str(error)) from error
    check_json_serializable(contract)
    check_defaults(contract)
    check_examples(contract)
    warnings = [*check_openai_tool(contract), *check_parameter_docs(contract)]
    warnings += [*check_numeric_bounds(contract), *check_sla(contract)]
    if impl is not None:
        check_binding(contract, impl)
        warnings += await check_calls(contract, impl)
    return tuple(warnings)
