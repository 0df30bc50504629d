"""The episodes package loads without the training stack, so `sessionrl envs` commands start quickly."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_driver_and_the_envs_cli_loads_no_torch() -> None:
    code = (
        "import sys, sessionrl.episodes, sessionrl.cli.envs; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
