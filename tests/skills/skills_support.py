"""Helpers shared by the skill library tests (fixtures built on them live in conftest.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sessionrl.skills import SkillContract, SkillError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "skills"

BASE: dict[str, Any] = {
    "name": "probe",
    "description": "A skill used by the tests.",
    "input_schema": {
        "type": "object",
        "required": ["amount"],
        "properties": {
            "amount": {"type": "number", "minimum": 0, "maximum": 120},
            "unit": {"type": "string", "enum": ["mg", "ml"], "default": "mg"},
        },
    },
    "output_schema": {"type": "object", "required": ["total"], "properties": {"total": {"type": "number"}}},
    "errors": {"FLAKY": {"retryable": True}, "BROKEN": {"retryable": False}},
    "sla": {"timeout_s": 1.0},
}

ContractFactory = Callable[..., SkillContract]


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class Script:
    """A skill function that plays back outcomes in order (the last one repeats) and counts its calls.

    An outcome is a payload dict, or an error code string that is raised as `SkillError`.
    """

    def __init__(self, outcomes: Sequence[dict[str, Any] | str]) -> None:
        self.outcomes = list(outcomes)
        self.seen: list[dict[str, Any]] = []

    def __call__(self, params: dict[str, Any]) -> dict[str, Any]:
        self.seen.append(params)
        outcome = self.outcomes[min(len(self.seen), len(self.outcomes)) - 1]
        if isinstance(outcome, str):
            raise SkillError(outcome, f"scripted failure {len(self.seen)}")
        return outcome

    @property
    def calls(self) -> int:
        return len(self.seen)
