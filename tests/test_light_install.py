"""`pip install sessionrl` without extras: no model stack, and the client and the reading commands work.

The wheel is built from this checkout and installed into a fresh virtual environment from the package
registry, as a user's would be; the environment is reused by the tests of this module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT.parent / "shared" / "seed-examples" / "anemia-session.json"
HEAVY = {"torch", "transformers", "peft", "tokenizers", "safetensors", "ray", "mcp", "scikit-learn"}

pytestmark = pytest.mark.slow


def run(*args: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("light")
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", ROOT, "-w", where / "wheel")
    run(sys.executable, "-m", "venv", where / "venv")
    (wheel,) = (where / "wheel").glob("sessionrl-*.whl")
    run(where / "venv" / "bin" / "python", "-m", "pip", "install", "-q", wheel)
    return where / "venv" / "bin"


def test_no_extras_installs_no_model_stack(venv: Path) -> None:
    listed = json.loads(run(venv / "python", "-m", "pip", "list", "--format", "json"))
    names = {row["name"].lower() for row in listed}
    assert "sessionrl" in names
    assert names & HEAVY == set()


def test_client_and_reading_commands_work(venv: Path, tmp_path: Path) -> None:
    run(venv / "python", "-c", "import sessionrl.client, sessionrl.store, sessionrl.service")
    sessionrl = venv / "sessionrl"
    assert "imported 8 event(s) for 1 session(s)" in run(sessionrl, "sessions", "import", SEED, cwd=tmp_path)
    assert "sess_abc123" in run(sessionrl, "sessions", "query", "--json", cwd=tmp_path)
    shown = run(sessionrl, "sessions", "show", "sess_abc123", cwd=tmp_path)
    assert "lab_result_parser" in shown
