"""Skill outputs may be any JSON value: executed, checked against the output schema when one is declared,
and refused (INVALID_OUTPUT) when they are not JSON, since they would not read back equal from a store."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from mcp.types import Tool
from skills_support import ContractFactory

from sessionrl.skills import (
    ContractError,
    ErrorCode,
    ExecutorConfig,
    ManualClock,
    SkillCheckError,
    SkillContract,
    SkillExecutor,
    callable_skill,
    check_skill,
    http_skill,
    parse_contract,
    simulated_skill,
)

ONCE = ExecutorConfig(max_attempts=1)


async def _answer(contract: SkillContract, value: Any) -> tuple[str | None, str | None, Any]:
    result = await SkillExecutor([callable_skill(contract, lambda params: value)], ONCE).call(
        contract.name, {"amount": 1}
    )
    return result.error_code, result.error_message, result.output


@pytest.mark.parametrize("value", [[1, 2], "ok", 3, 2.5, True, None, {"nested": [{"a": None}]}])
async def test_any_json_value_is_an_answer_when_no_output_schema_is_declared(
    make_contract: ContractFactory, value: Any
):
    contract = make_contract().model_copy(update={"output_schema": {}})
    assert await _answer(contract, value) == (None, None, value)


async def test_a_declared_array_schema_checks_the_items(make_contract: ContractFactory):
    contract = make_contract().model_copy(
        update={"output_schema": {"type": "array", "items": {"type": "integer"}}}
    )
    assert await _answer(contract, [1, 2]) == (None, None, [1, 2])
    code, message, output = await _answer(contract, [1, "two"])
    assert (code, message, output) == (ErrorCode.INVALID_OUTPUT, "[1]: 'two' is not of type 'integer'", None)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ((1, 2), "output: a tuple is not a JSON value"),
        ({"ids": {1, 2}}, "ids: a set is not a JSON value"),
        ({"x": float("inf")}, "x: inf is not a finite number"),
    ],
)
async def test_an_answer_that_is_not_json_is_invalid_output(
    make_contract: ContractFactory, value: Any, message: str
):
    contract = make_contract().model_copy(update={"output_schema": {}})
    code, text, _ = await _answer(contract, value)
    assert code == ErrorCode.INVALID_OUTPUT
    assert text is not None
    assert text.startswith(message)


def test_a_contract_may_declare_any_output_root_but_parameters_stay_an_object(make_contract: ContractFactory):
    base = make_contract().model_dump()
    strings = parse_contract({**base, "output_schema": {"type": "array", "items": {"type": "string"}}})
    assert strings.output_schema["type"] == "array"
    assert parse_contract({**base, "output_schema": {"type": "string"}}).output_schema == {"type": "string"}
    with pytest.raises(ContractError, match=r"input_schema.*type: object"):
        parse_contract({**base, "input_schema": {"type": "array"}})


def test_an_undeclared_output_schema_accepts_anything() -> None:
    contract = parse_contract({"name": "echo", "description": "Echo.", "input_schema": {"type": "object"}})
    assert contract.output_schema == {}


def test_mcp_export_gives_an_output_schema_only_for_objects(make_contract: ContractFactory):
    objects = make_contract()
    arrays = objects.model_copy(update={"output_schema": {"type": "array"}})
    assert Tool.model_validate(objects.to_mcp_tool()).output_schema == objects.output_schema
    assert "outputSchema" not in arrays.to_mcp_tool()
    assert Tool.model_validate(arrays.to_mcp_tool()).output_schema is None


async def test_check_skill_holds_a_list_answer_to_the_schema(make_contract: ContractFactory):
    contract = make_contract(examples=[{"amount": 1}]).model_copy(
        update={"output_schema": {"type": "array", "items": {"type": "integer"}}}
    )
    warnings = await check_skill(contract, callable_skill(contract, lambda p: [p["amount"]]))
    assert not [w for w in warnings if "output" in w]
    with pytest.raises(SkillCheckError, match="not JSON: output: a tuple"):
        await check_skill(contract, callable_skill(contract, lambda p: (p["amount"],)))


class ListHandler(BaseHTTPRequestHandler):
    """Answers every POST with a JSON array, or (on /text) with a body that is not JSON."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        data = b"plain words" if self.path == "/text" else json.dumps([{"id": 1}, "two", None]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def list_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ListHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def test_an_http_skill_may_answer_with_an_array(make_contract: ContractFactory, list_url: str):
    contract = make_contract().model_copy(update={"output_schema": {"type": "array"}})
    async with SkillExecutor([http_skill(contract, list_url + "/list")], ONCE) as executor:
        listed = await executor.call(contract.name, {"amount": 1})
    assert listed.output == [{"id": 1}, "two", None]
    async with SkillExecutor([http_skill(contract, list_url + "/text")], ONCE) as executor:
        broken = await executor.call(contract.name, {"amount": 1})
    assert (broken.error_code, broken.error_message) == (
        ErrorCode.INVALID_OUTPUT,
        f"{list_url}/text answered with no JSON",
    )


async def test_a_simulated_stand_in_answers_with_a_fresh_sample_of_any_root_type(
    make_contract: ContractFactory,
):
    schema = {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["id"]}}
    contract = make_contract(simulation={"mean_ms": 0.0}).model_copy(update={"output_schema": schema})
    skill = simulated_skill(contract)
    first = await skill.invoke({"amount": 1}, ManualClock())
    assert first == [{"id": None}]
    first[0]["id"] = "changed"  # a caller's edit does not leak into the next answer
    assert await skill.invoke({"amount": 1}, ManualClock()) == [{"id": None}]
    anything = make_contract(simulation={"mean_ms": 0.0}).model_copy(update={"output_schema": {}})
    assert await simulated_skill(anything).invoke({"amount": 1}, ManualClock()) is None
