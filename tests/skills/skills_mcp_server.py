"""A tiny MCP server (stdio) with lab-order tools, started by the MCP skill tests as a subprocess."""

from __future__ import annotations

import json
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("lab-orders")


@server.tool()
def order_crp(patient_id: str, priority: str = "routine", fasting_hours: float = 0) -> dict[str, Any]:
    """Order a CRP test; fails with PATIENT_NOT_FOUND for unknown patients."""
    if patient_id == "p-missing":
        raise ToolError(f"PATIENT_NOT_FOUND: no patient {patient_id}")
    minutes = 15 if priority == "stat" else 90
    return {"order_id": f"o-{patient_id}", "status": "queued", "expected_ready_minutes": minutes}


@server.tool(structured_output=False)
def lab_status(patient_id: str) -> str:
    """A plain-text answer, as tau-bench tools give: no structured content, text that is not JSON."""
    return f"no pending orders for {patient_id}"


@server.tool(structured_output=False)
def open_orders(patient_id: str) -> str:
    """A JSON array written as text, with no structured content."""
    return json.dumps([f"o-{patient_id}", f"o-{patient_id}-b"])


if __name__ == "__main__":
    server.run()
