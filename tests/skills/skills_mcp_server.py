"""A tiny MCP server (stdio) with one lab-order tool, started by the MCP skill tests as a subprocess."""

from __future__ import annotations

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


if __name__ == "__main__":
    server.run()
