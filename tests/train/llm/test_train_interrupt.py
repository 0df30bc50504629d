"""Ctrl-C during `sessionrl train` ends with how to continue, not a traceback: `--resume` for the trainers
that keep checkpoints, a new run for the others; exit status 130."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.train import dispatch


def interrupt(*_: object, **__: object) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("trainer", "said"),
    [
        ("grpo", "--resume` continues from the last checkpoint in"),
        ("sft", "--resume` continues from the last checkpoint in"),
        ("ppo", "trainer ppo keeps no checkpoint: run it again with a new run_dir"),
    ],
)
def test_ctrl_c_says_how_to_continue(
    trainer: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "run.yaml"
    extra = {"ppo": {}} if trainer == "ppo" else {}
    config.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), "trainer": trainer, **extra}))
    monkeypatch.setattr(dispatch, "run_trainer", interrupt)
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 130
    text = " ".join(result.output.split())
    assert "interrupted." in text
    assert said in text
    if trainer != "ppo":
        assert f"sessionrl train {config} --resume" in text
    assert "Traceback" not in text
