"""docs/http.md, run as written: its curl examples, in order in one shell, against a live `sessionrl serve`.

Each curl is `-f`, so any answer outside 2xx fails the script. The session the doc builds is then read back
from the store, so the test checks what was recorded, not only that the routes answered.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from markdown_support import read_blocks
from sessionrl.session import CallStatus, FeedbackType
from sessionrl.store import SessionStore

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "http.md"
TOKEN = "docs-token"

pytestmark = pytest.mark.slow


def blocks(language: str) -> list[str]:
    """The page's blocks in `language`, in order (its ```console block starts the service, which the
    fixture does)."""
    return [block.text for block in read_blocks(DOC) if block.language == language]


def as_reader(argv: list[str], base: str) -> str:
    """What `argv` printed, run as the page's reader runs it (BASE and TOKEN exported); it must exit 0."""
    env = os.environ | {"BASE": base, "TOKEN": TOKEN}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`sessionrl serve` on a free port with the tour's skills, its token from $SESSIONRL_TOKENS."""
    db = tmp_path / "sessions.db"
    env = os.environ | {"SESSIONRL_TOKENS": f"{TOKEN}:read,write"}
    argv = [Path(sys.executable).parent / "sessionrl", "serve", "--skills", "examples/skills"]
    process = subprocess.Popen(
        [*map(str, argv), "--db", str(db), "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    try:
        for line in process.stderr:
            if line.startswith("listening on "):
                yield line.split()[-1], db
                break
        else:
            pytest.fail("sessionrl serve stopped before it listened")
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def test_every_example_runs_and_is_recorded(service: tuple[str, Path], tmp_path: Path) -> None:
    base, db = service
    curls = blocks("bash")
    assert len(curls) >= 8  # create, plan, tool, llm, recorded tool, finish, feedback, read
    script = tmp_path / "doc.sh"
    script.write_text("set -euo pipefail\n" + "\n".join(curls), encoding="utf-8")
    sid = as_reader(["bash", str(script)], base).splitlines()[0].strip()
    with SessionStore.open(f"sqlite:///{db}") as store:
        session = store.get(sid)
    assert session.state.value == "finished"
    assert [c.tool for c in session.tool_calls] == ["crp_test_request", "lookup_order"]
    assert all(c.status is CallStatus.SUCCESS for c in session.tool_calls)
    (llm,) = session.llm_calls
    assert llm.tool_calls[0].arguments == '{"order_id": "O-1"}'
    ratings = sorted((f.annotator, f.score) for f in session.feedback if f.type is FeedbackType.HUMAN_RATING)
    assert ratings == [("doc_007", 4.0), ("doc_012", 2.0)]


def test_the_client_example_runs_and_is_recorded(service: tuple[str, Path]) -> None:
    """The page's Python example: the typed client, on the same service, as a reader runs it after the
    curl examples (BASE and TOKEN exported)."""
    base, db = service
    (example,) = blocks("python")
    sid, ok, state, feedback = as_reader([sys.executable, "-c", example], base).split()
    assert (ok, state, feedback) == ("True", "finished", "1")
    with SessionStore.open(f"sqlite:///{db}") as store:
        session = store.get(sid)
    assert [(c.tool, c.status) for c in session.tool_calls] == [
        ("crp_test_request", CallStatus.SUCCESS),
        ("lookup_order", CallStatus.SUCCESS),
    ]
    assert [(f.annotator, f.score) for f in session.feedback if f.type is FeedbackType.HUMAN_RATING] == [
        ("doc_007", 5.0)
    ]
