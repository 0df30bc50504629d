"""Functions the sandbox tests run by module path (`skills_sandbox_targets:double`)."""

from __future__ import annotations

from typing import Any


def double(params: dict[str, Any]) -> dict[str, Any]:
    """Twice the amount."""
    return {"total": params["amount"] * 2}
