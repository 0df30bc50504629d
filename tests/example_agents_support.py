"""The example agents of `examples/agents`, loaded from their files for tests (they are scripts, not a
package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

AGENTS = Path(__file__).resolve().parents[1] / "examples" / "agents"


def load_example(name: str) -> ModuleType:
    """The module `examples/agents/<name>.py`, run once more on each call."""
    spec = importlib.util.spec_from_file_location(name, AGENTS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
