"""Commands that do not train start without the training stack: neither importing the CLI nor running
them (their help, and a cheap command on an empty store) loads torch or transformers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LIGHT = ("sessions", "store", "serve", "rewards", "schema", "policies", "ui", "envs")
"""Commands that never need torch (`serve` only for a local model, loaded when one is served)."""


def test_commands_that_do_not_train_load_no_torch(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    runs = [[name, "--help"] for name in LIGHT]
    runs += [["sessions", "list", "--db", db], ["store", "check", "--db", db]]
    code = (
        "import sys\n"
        "from sessionrl.cli import app\n"
        "from sessionrl.store import SessionStore\n"
        f"SessionStore.open('sqlite:///{db}').close()\n"
        f"for args in {runs!r}:\n"
        "    app(args, prog_name='sessionrl', standalone_mode=False)\n"
        "print('LOADED', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for name in LIGHT:  # every command ran
        assert f"Usage: sessionrl {name}" in done.stdout
    assert done.stdout.splitlines()[-1] == "LOADED []"
