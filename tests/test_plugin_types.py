"""An extension outside the package type-checks under `mypy --strict`: the package ships `py.typed`, and
its decorators and extension types keep the plugin's own signatures."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
LIBRARY = HERE / "envs" / "taubench" / "library_domain.py"

SKILL_AND_TERM = """
from __future__ import annotations

from sessionrl.rewards import ScoringContext, TermFn, TermResult
from sessionrl.session import Session
from sessionrl.skills import CallableSkill, SkillContract, callable_skill
from sessionrl.skills.skill import Json, JsonValue


def crp(params: Json) -> JsonValue:
    return {"crp_mg_l": 4.0, "patient": params["patient"]}


def bind(contract: SkillContract) -> CallableSkill:
    return callable_skill(contract, crp)


def few_calls(session: Session, context: ScoringContext) -> TermResult:
    return TermResult(value=-0.1 * len(session.tool_calls))


TERM: TermFn = few_calls
"""

MISTAKE = """
from __future__ import annotations

from sessionrl.skills import CallableSkill, SkillContract, callable_skill


def bind(contract: SkillContract) -> CallableSkill:
    return callable_skill(contract, "not a function")
"""
"""A plugin with one type error: mypy must see it, so it checks against the package's real types."""

pytestmark = pytest.mark.slow


def test_plugins_pass_mypy_strict_and_a_mistake_is_caught(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    shutil.copy(LIBRARY, plugin / "library_domain.py")
    (plugin / "skill_and_term.py").write_text(SKILL_AND_TERM)
    (plugin / "mistake.py").write_text(MISTAKE)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), "."],
        cwd=plugin,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, done.stdout + done.stderr
    assert errors[0].startswith("mistake.py:8:")
    assert "[arg-type]" in errors[0]
