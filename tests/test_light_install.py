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
EXTRAS_ONLY = {"jinja2"}
"""Not heavy, but the dashboard's alone: it comes with the `ui` extra."""

pytestmark = pytest.mark.slow


def run(*args: str | Path, cwd: Path | None = None, status: int = 0) -> str:
    """What the command printed on stdout; it must exit with `status`."""
    return said(*args, cwd=cwd, status=status)[0]


def said(*args: str | Path, cwd: Path | None = None, status: int = 0) -> tuple[str, str]:
    """What the command printed on stdout and on stderr; it must exit with `status`."""
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == status, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout, done.stderr


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
    assert names & (HEAVY | EXTRAS_ONLY) == set()


def test_client_and_reading_commands_work(venv: Path, tmp_path: Path) -> None:
    run(venv / "python", "-c", "import sessionrl.client, sessionrl.store, sessionrl.service")
    sessionrl = venv / "sessionrl"
    assert "imported 8 event(s) for 1 session(s)" in run(sessionrl, "sessions", "import", SEED, cwd=tmp_path)
    assert "sess_abc123" in run(sessionrl, "sessions", "query", "--json", cwd=tmp_path)
    shown = run(sessionrl, "sessions", "show", "sess_abc123", cwd=tmp_path)
    assert "lab_result_parser" in shown


SERVICE_WITHOUT_UI = """
from sessionrl.service.app import create_app
from sessionrl.service.config import ServiceConfig
app = create_app(ServiceConfig(db_url="sqlite://"))
mounted = {getattr(route, "path", "") for route in app.routes}
print("/v1/sessions" in app.openapi()["paths"], any(path.startswith(("/ui", "/docs")) for path in mounted))
"""


def test_the_dashboard_says_which_extra_it_needs(venv: Path, tmp_path: Path) -> None:
    sessionrl = venv / "sessionrl"
    run(sessionrl, "sessions", "import", SEED, cwd=tmp_path)
    _, refused = said(sessionrl, "ui", cwd=tmp_path, status=1)
    assert "pip install 'sessionrl[ui]'" in refused
    routes, warned = said(venv / "python", "-c", SERVICE_WITHOUT_UI, cwd=tmp_path)
    assert routes.split() == ["True", "False"]  # the API without the pages
    assert "pip install 'sessionrl[ui]'" in warned  # and a warning that says how to get them
