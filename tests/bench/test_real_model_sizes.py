"""bench/real_model.py sizes each domain's run from the retail example: at full size every training task of
the domain is demonstrated once, and no more demonstrations are asked for than it has tasks (orders has
fewer than retail, and a run missing more than 5% of its demonstrations stops)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import real_model
from sessionrl.envs.base import Split
from sessionrl.train.config import RunConfig


def sized(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> RunConfig:
    monkeypatch.setattr(sys, "argv", ["real_model.py", "--out", str(tmp_path), *flags])
    return real_model.sized(RunConfig.load(real_model.EXAMPLE), "orders", tmp_path, real_model.arguments())


def test_full_size_demonstrates_each_orders_training_task_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = RunConfig.load(real_model.EXAMPLE)
    config = sized(tmp_path, monkeypatch)
    train_tasks = len(config.env.build().tasks(Split.TRAIN))
    assert train_tasks < example.sft.demos  # the example's count is retail's: orders cannot give it
    assert config.sft.demos == train_tasks
    assert config.env.name == "orders"
    assert (config.evaluation.tasks, config.run_dir) == (real_model.TEST_TASKS, tmp_path / "orders" / "train")


def test_the_flags_size_the_demonstrations_as_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert sized(tmp_path, monkeypatch, "--demos", "40").sft.demos == 40
    assert sized(tmp_path, monkeypatch, "--limit", "5").sft.demos == 16  # --limit's small size


def test_the_seed_flag_sets_the_runs_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert sized(tmp_path, monkeypatch).seed == RunConfig.load(real_model.EXAMPLE).seed
    assert sized(tmp_path, monkeypatch, "--seed", "2").seed == 2
