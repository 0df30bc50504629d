"""check_skill: every shipped contract passes, and broken contracts or implementations fail with a fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from skills_support import BASE, EXAMPLES, ContractFactory, merge

from sessionrl.skills import (
    SimulationProfile,
    SkillCheckError,
    SkillError,
    callable_skill,
    check_fallback,
    check_skill,
    load_contract,
    load_contracts,
    simulated_skill,
)

CONTRACTS = load_contracts(EXAMPLES)


@pytest.mark.parametrize("name", sorted(CONTRACTS))
async def test_every_example_contract_and_a_simulation_of_it_pass_cleanly(name: str):
    contract = CONTRACTS[name]
    assert await check_skill(contract) == ()
    instant = contract.model_copy(update={"simulation": SimulationProfile(mean_ms=0.0)})  # never fails either
    assert await check_skill(instant, simulated_skill(instant)) == ()


def test_every_example_fallback_accepts_the_primary_parameters():
    check_fallback(CONTRACTS["pdf_parse"], CONTRACTS["pdf_text_extract"])


def test_a_fallback_with_a_narrower_schema_is_caught(make_contract: ContractFactory):
    primary = make_contract(name="primary", fallback="backup", examples=[{"amount": 5, "unit": "ml"}])
    backup = make_contract(name="backup", input_schema={"properties": {"unit": {"enum": ["mg"]}}})
    with pytest.raises(
        SkillCheckError, match=r"fallback backup rejects examples\[0\] \(unit: 'ml' is not one of"
    ):
        check_fallback(primary, backup)


async def test_a_broken_contract_mapping_is_reported_with_its_field():
    broken = merge(BASE, {"sla": {"timeout_s": -1}})
    with pytest.raises(SkillCheckError, match=r"sla\.timeout_s: Input should be greater than 0"):
        await check_skill(broken)


async def test_a_default_outside_its_own_schema_is_caught():
    broken = merge(BASE, {"input_schema": {"properties": {"unit": {"default": "kg"}}}})
    with pytest.raises(SkillCheckError) as caught:
        await check_skill(broken)
    assert str(caught.value) == (
        "probe: input_schema.properties.unit.default 'kg' breaks its own schema "
        "(default: 'kg' is not one of ['mg', 'ml']); change the default or the schema"
    )


async def test_an_invalid_example_is_caught():
    with pytest.raises(
        SkillCheckError, match=r"examples\[1\] is not valid input \(amount: 130 is greater than"
    ):
        await check_skill(merge(BASE, {"examples": [{"amount": 1}, {"amount": 130}]}))


async def test_an_unquoted_yaml_date_is_caught(tmp_path: Path):
    text = (EXAMPLES / "db_query.yaml").read_text(encoding="utf-8")
    path = tmp_path / "dated.yaml"
    path.write_text(
        text.replace("default: 500", "default: 500\n      examples: [2024-01-31]"), encoding="utf-8"
    )
    with pytest.raises(SkillCheckError, match="quote dates and times in the YAML"):
        await check_skill(path)


async def test_smells_come_back_as_warnings(make_contract: ContractFactory):
    contract = make_contract(sla={"timeout_s": 0.5, "p95_ms": 900}, simulation={"mean_ms": 600})
    assert await check_skill(contract) == (
        "probe: input_schema.properties.amount has no description; add one so a model knows what to pass",
        "probe: input_schema.properties.unit has no description; add one so a model knows what to pass",
        "probe: sla.p95_ms 900.0 exceeds the 500 ms timeout",
        "probe: simulation.mean_ms reaches the timeout; most simulated calls time out",
    )


async def test_an_answer_against_the_output_schema_is_caught(make_contract: ContractFactory):
    contract = make_contract(examples=[{"amount": 3}])
    skill = callable_skill(contract, lambda params: {"total": "three"})
    with pytest.raises(
        SkillCheckError, match=r"input 0 .* answered against output_schema: total: 'three' is not of type"
    ):
        await check_skill(contract, skill)


async def test_an_undeclared_error_code_is_caught(make_contract: ContractFactory):
    def fails(params: dict[str, Any]) -> dict[str, Any]:
        raise SkillError("OUT_OF_STOCK", "none left")

    contract = make_contract()
    with pytest.raises(SkillCheckError, match="undeclared code 'OUT_OF_STOCK'; declare it under `errors`"):
        await check_skill(contract, callable_skill(contract, fails))


async def test_a_declared_error_is_only_a_warning(make_contract: ContractFactory):
    def fails(params: dict[str, Any]) -> dict[str, Any]:
        raise SkillError("FLAKY", "try later")

    contract = make_contract()
    warnings = await check_skill(contract, callable_skill(contract, fails))
    assert warnings[-1] == "probe: input 0 ({'amount': 0}) failed with FLAKY: try later"


async def test_a_stray_exception_asks_for_skill_error(make_contract: ContractFactory):
    def crashes(params: dict[str, Any]) -> dict[str, Any]:
        raise ZeroDivisionError("division by zero")

    contract = make_contract()
    with pytest.raises(SkillCheckError, match=r"raised ZeroDivisionError.*raise SkillError\(code, message\)"):
        await check_skill(contract, callable_skill(contract, crashes))


async def test_an_implementation_bound_to_another_contract_is_caught(make_contract: ContractFactory):
    other = callable_skill(make_contract(name="other"), lambda params: {"total": 1})
    with pytest.raises(SkillCheckError, match="bound to contract 'other'"):
        await check_skill(make_contract(), other)


async def test_a_contract_path_is_accepted():
    assert await check_skill(EXAMPLES / "pdf_parse.yaml") == ()
    assert load_contract(EXAMPLES / "pdf_parse.yaml").name == "pdf_parse"
