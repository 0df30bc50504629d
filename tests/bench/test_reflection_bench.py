"""bench/reflection.py --model smollm2 runs examples/orders-smollm2-reflection.yaml on a given policy."""

from __future__ import annotations

import argparse
from pathlib import Path

import reflection as bench  # bench/reflection.py
from sessionrl.envs.base import Split
from sessionrl.train.config import RunConfig


def flags(tmp_path: Path, **given: object) -> argparse.Namespace:
    defaults = {"reflect_tasks": None, "reflection_steps": None, "reflection_lr": None}
    return argparse.Namespace(
        run_dir=tmp_path / "run", policy=tmp_path / "policy", eval_tasks=40, held_out=30, **(defaults | given)
    )


def test_the_smollm2_run_is_its_example_on_the_given_policy_and_test_tasks(tmp_path: Path) -> None:
    example = RunConfig.load(bench.EXAMPLES / "orders-smollm2-reflection.yaml")
    config = bench.smollm2_config(flags(tmp_path))
    assert config.stages == ("imitation", "rl", "reflection")
    assert (config.run_dir, config.model.path) == (tmp_path / "run", tmp_path / "policy")
    assert config.model.lora == example.model.lora is not None
    assert (config.sft.trainer.steps, config.rl.iterations) == (0, 0)  # nothing trained before reflection
    assert (config.evaluation.split, config.evaluation.tasks, config.reflection.held_out) == (
        Split.TEST,
        40,
        30,
    )
    assert config.reflection.trainer == example.reflection.trainer
    assert config.reflection.tasks == example.reflection.tasks
    given = bench.smollm2_config(flags(tmp_path, reflect_tasks=8, reflection_steps=5, reflection_lr=1e-4))
    assert (given.reflection.tasks, given.reflection.trainer.steps, given.reflection.trainer.lr) == (
        8,
        5,
        1e-4,
    )
    assert given.reflection.trainer.batch_sessions == example.reflection.trainer.batch_sessions
