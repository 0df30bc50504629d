"""Contracts: loading the shipped examples, export shapes, and clear errors for broken contracts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp_types import Tool
from skills_support import BASE, EXAMPLES, merge

from sessionrl.skills import (
    ContractError,
    RiskLevel,
    SkillContract,
    load_contract,
    load_contracts,
    parse_contract,
)


def test_the_example_folder_loads_by_name():
    contracts = load_contracts(EXAMPLES)
    assert sorted(contracts) == ["crp_test_request", "db_query", "pdf_parse", "pdf_text_extract"]
    crp = contracts["crp_test_request"]
    assert crp.risk is RiskLevel.MEDIUM
    assert crp.input_schema["properties"]["fasting_hours"]["maximum"] == 24
    assert crp.errors["LAB_UNAVAILABLE"].retryable
    assert crp.sla.rate_limit is not None
    assert crp.sla.rate_limit.max_calls == 20
    assert contracts["pdf_parse"].fallback == "pdf_text_extract"


def test_openai_export_shape():
    contract = load_contract(EXAMPLES / "crp_test_request.yaml")
    tool = contract.to_openai_tool()
    assert tool == {
        "type": "function",
        "function": {
            "name": "crp_test_request",
            "description": contract.description,
            "parameters": contract.input_schema,
        },
    }
    assert tool["function"]["parameters"]["required"] == ["patient_id"]


def test_mcp_export_is_a_valid_mcp_tool():
    contract = load_contract(EXAMPLES / "db_query.yaml")
    tool = Tool.model_validate(contract.to_mcp_tool())
    assert (tool.name, tool.input_schema, tool.output_schema) == (
        "db_query",
        contract.input_schema,
        contract.output_schema,
    )


def test_retryability_comes_from_the_contract_then_the_standard_table():
    contract = SkillContract.model_validate(merge(BASE, {"errors": {"TIMEOUT": {"retryable": False}}}))
    assert contract.is_retryable("FLAKY")
    assert not contract.is_retryable("BROKEN")
    assert not contract.is_retryable("TIMEOUT")  # the contract overrides the standard table
    assert contract.is_retryable("UNAVAILABLE")
    assert not contract.is_retryable("NEVER_DECLARED")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"input_schema": {"type": "array"}},
            "input_schema: Value error, must have `type: object` at its root",
        ),
        (
            {"input_schema": {"type": "object", "properties": {"a": {"type": "float"}}}},
            "is not valid JSON Schema at properties.a.type",
        ),
        ({"errors": {"lab-down": {"retryable": True}}}, "error codes must be UPPER_SNAKE_CASE"),
        ({"fallback": "probe"}, "names the skill itself"),
        (
            {"simulation": {"mean_ms": 10, "fail_codes": ["LAB_DOWN"]}},
            "simulation.fail_codes ['LAB_DOWN'] are neither standard codes nor declared under `errors`",
        ),
        ({"sla": {"breaker": {"window": 3, "min_calls": 5}}}, "min_calls (5) cannot exceed window (3)"),
        ({"sla": {"timeout": 3}}, "sla.timeout: Extra inputs are not permitted"),
        ({"name": "order lab test"}, "name: String should match pattern"),
        ({"risk": "extreme"}, "risk: Input should be 'low', 'medium' or 'high'"),
    ],
)
def test_a_broken_contract_is_rejected_with_the_field_and_the_rule(overrides: dict[str, Any], expected: str):
    with pytest.raises(ContractError) as caught:
        parse_contract(merge(BASE, overrides), source="probe.yaml")
    assert str(caught.value).startswith("probe.yaml: invalid skill contract")
    assert expected in str(caught.value)


def test_yaml_problems_name_the_file(tmp_path: Path):
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n", encoding="utf-8")
    with pytest.raises(ContractError, match=r"bad\.yaml: cannot read the contract"):
        load_contract(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(ContractError, match="a contract must be a mapping of fields, got list"):
        load_contract(tmp_path / "list.yaml")


def test_two_contracts_with_one_name_are_refused(tmp_path: Path):
    text = (EXAMPLES / "db_query.yaml").read_text(encoding="utf-8")
    for name in ("a.yaml", "b.yml"):
        (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(ContractError, match="a second contract is named 'db_query'"):
        load_contracts(tmp_path)
