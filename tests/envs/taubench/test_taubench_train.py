"""The made-up library domain trains through `sessionrl train` from a config that names it as module:Class."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from library_domain import DATA
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.store import SessionStore
from sessionrl.train.config import RunConfig

pytestmark = pytest.mark.slow

CONFIG = """
run_dir: {run_dir}
env: {{name: "library_domain:LibraryEnv", options: {{data: {data}}}}}
model: {{tiny: {{vocab_size: 400, hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64}}}}
rollout: {{max_steps: 6, full_schemas: false, domain_policy: false, max_tool_chars: 120}}
sft: {{demos: 3, trainer: {{steps: 1, batch_sessions: 3, token_budget: 4096}}}}
rl: {{iterations: 1, tasks_per_iteration: 1, sampling: {{max_new_tokens: 12}}, trainer: {{group_size: 2}}}}
evaluation: {{split: test, tasks: 2, gate_split: dev, gate_tasks: 1, max_new_tokens: 12}}
"""


def test_sessionrl_train_runs_on_a_domain_from_outside_the_package(tmp_path: Path) -> None:
    config = tmp_path / "library.yaml"
    config.write_text(CONFIG.format(run_dir=tmp_path / "run", data=DATA))
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 0, result.output
    assert "3 of 3 demonstrations usable" in result.output
    assert "library_domain:LibraryEnv · test · 2 tasks" in result.output
    kept = RunConfig.model_validate(yaml.safe_load((tmp_path / "run" / "config.yaml").read_text()))
    assert (kept.env.name, kept.env.options) == ("library_domain:LibraryEnv", {"data": str(DATA)})
    with SessionStore.open(f"sqlite:///{tmp_path / 'run' / 'sessions.db'}") as store:
        sessions = [store.get(session_id) for session_id in store.session_ids()]
    assert {session.metadata["env"] for session in sessions} == {"library"}
    # the run's store also holds the expert's gold episodes on the evaluated tasks, which tool accuracy reads
    demos = [s for s in sessions if s.metadata.get("agent") == "expert" and s.metadata.get("stage") != "gold"]
    assert sorted(s.metadata["task_id"] for s in demos) == [f"library-train-{i}" for i in range(3)]


def test_training_a_test_only_domain_says_a_train_split_is_missing(tmp_path: Path) -> None:
    folder = tmp_path / "test-only"
    shutil.copytree(DATA, folder)
    for split in ("train", "dev"):
        (folder / f"tasks_{split}.json").unlink()
    config = yaml.safe_load(CONFIG.format(run_dir=tmp_path / "run", data=folder))
    (tmp_path / "library.yaml").write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(app, ["train", str(tmp_path / "library.yaml")])
    assert result.exit_code == 1, result.output
    assert "library has no train tasks (its tasks: 2 test); training learns from train tasks" in result.stderr
    assert "tasks_train.json in its data folder" in result.stderr
