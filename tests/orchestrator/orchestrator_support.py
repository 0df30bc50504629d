"""Types of the orchestrator test fixtures (the fixtures live in conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.skills import SkillContract

MakeContract = Callable[..., SkillContract]
MakeEngine = Callable[..., Orchestrator]
