"""`sessionrl eval RUN --levels` judges the levels of the sessions a run stored, running nothing new."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.envs import build
from sessionrl.envs.base import Split
from sessionrl.episodes import expert, run_many
from sessionrl.store import SessionStore


def test_eval_levels_reads_the_run_store(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    env_options = {"name": "orders", "train": 6, "dev": 1, "test": 1, "time_factor": 0}
    (run / "config.yaml").write_text(yaml.safe_dump({"run_dir": str(run), "env": env_options}))
    env = build("orders", train=6, dev=1, test=1, time_factor=0)
    with SessionStore.open(f"sqlite:///{run / 'sessions.db'}") as store:
        run_many(env, Split.TRAIN, expert(env), store=store, show_progress=False)
    result = CliRunner().invoke(app, ["eval", str(run), "--levels"])
    assert result.exit_code == 0, result.output
    assert "L1 execution" in result.output
    levels = json.loads(result.output.strip().splitlines()[-1])["unlabelled"]
    # the expert calls every tool right (L1 over 8 kinds), reads every field (L2) and decomposes the long
    # tasks right (L3, lengths from the env's expert); no follow-up or retry was stored (L4, L5 unmeasured)
    assert [levels[level]["passed"] for level in ("L1", "L2", "L3", "L4", "L5")] == [
        True,
        True,
        True,
        None,
        None,
    ]
    assert levels["reached"] == "L3"
    assert "detail" not in levels["L1"]  # the evidence is in the run folder, not on the line
    evidence = json.loads((run / "levels.json").read_text())["unlabelled"]
    assert evidence["L1"]["passed"] is True
    assert "detail" in evidence["L1"]
