"""An MCP skill against a real MCP server process, spoken to over stdio."""

from __future__ import annotations

import sys
from pathlib import Path

from skills_support import EXAMPLES

from sessionrl.skills import ErrorCode, SkillExecutor, load_contract, mcp_skill

SERVER = Path(__file__).with_name("skills_mcp_server.py")
CRP = load_contract(EXAMPLES / "crp_test_request.yaml")


async def test_a_tool_of_an_mcp_server_serves_as_a_skill():
    skill = mcp_skill(CRP, [sys.executable, str(SERVER)], tool="order_crp")
    async with SkillExecutor([skill]) as executor:
        ok = await executor.call("crp_test_request", {"patient_id": "p-1", "priority": "stat"})
        missing = await executor.call("crp_test_request", {"patient_id": "p-missing"})
        again = await executor.call("crp_test_request", {"patient_id": "p-2"})
    assert ok.ok
    assert ok.output == {"order_id": "o-p-1", "status": "queued", "expected_ready_minutes": 15}
    assert (missing.error_code, missing.retryable, missing.attempts) == ("PATIENT_NOT_FOUND", False, 1)
    assert missing.error_message == "no patient p-missing"
    assert again.output is not None
    assert again.output["order_id"] == "o-p-2"  # the same server process answers later calls


async def test_a_missing_tool_and_a_missing_server_are_errors():
    wrong_tool = mcp_skill(CRP, [sys.executable, str(SERVER)], tool="order_ferritin")
    async with SkillExecutor([wrong_tool]) as executor:
        result = await executor.call("crp_test_request", {"patient_id": "p-1"})
    assert result.error_code == ErrorCode.INTERNAL
    assert "order_ferritin" in (result.error_message or "")

    no_server = mcp_skill(CRP, ["/nonexistent/mcp-server"])
    async with SkillExecutor([no_server]) as executor:
        result = await executor.call("crp_test_request", {"patient_id": "p-1"})
    assert (result.error_code, result.attempts) == (ErrorCode.UNAVAILABLE, 3)


async def test_text_content_is_parsed_as_json_or_kept_as_text():
    anything = CRP.model_copy(update={"output_schema": {}})
    server = [sys.executable, str(SERVER)]
    text = mcp_skill(anything, server, tool="lab_status")
    listed = mcp_skill(anything.model_copy(update={"name": "open_orders"}), server, tool="open_orders")
    async with SkillExecutor([text, listed]) as executor:
        said = await executor.call("crp_test_request", {"patient_id": "p-1"})
        orders = await executor.call("open_orders", {"patient_id": "p-1"})
    assert said.output == "no pending orders for p-1"
    assert orders.output == ["o-p-1", "o-p-1-b"]
