"""The README's Python examples run as written, from a scratch folder holding the example contracts."""

from __future__ import annotations

import os
import re
import runpy
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "runs").mkdir()
    script = tmp_path / f"example_{index}.py"
    script.write_text(BLOCKS[index], encoding="utf-8")
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        os.chdir(cwd)
    assert capsys.readouterr().out.strip(), "each example prints what it shows"
