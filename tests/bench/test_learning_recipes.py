"""bench/learning.py --model smollm2 joins the three orders-smollm2 examples into one run."""

from __future__ import annotations

from pathlib import Path

import learning
from sessionrl.envs.base import Split
from sessionrl.train.config import RunConfig


def test_the_smollm2_recipe_takes_each_stage_from_its_example(tmp_path: Path) -> None:
    config = learning.smollm2_config(tmp_path / "run", seed=2, rl_iterations=None, eval_tasks=40)
    sft, rft, grpo = (
        RunConfig.load(learning.EXAMPLES / f"orders-smollm2-{stage}.yaml") for stage in ("sft", "rft", "grpo")
    )
    assert config.trainer == "grpo"
    assert (config.run_dir, config.seed) == (tmp_path / "run", 2)
    assert config.model.gguf == sft.model.gguf  # the shipped model, not an earlier stage's folder
    assert config.sft == sft.sft
    assert sft.sft.trainer.steps > 0
    assert config.rft is not None
    assert rft.rft is not None
    assert (config.rft.rounds, config.rft.accept, config.rft.trainer) == (
        rft.rft.rounds,
        rft.rft.accept,
        rft.rft.trainer,
    )
    assert config.rl.iterations == grpo.rl.iterations
    assert config.rl.curriculum
    assert config.rl.trainer == grpo.rl.trainer
    assert config.rl.sampling.seed == config.rft.sampling.seed == 2  # the seed reaches every sampler
    assert config.rewards.rules is not None
    assert config.rewards.rules.is_file()
    assert (config.evaluation.split, config.evaluation.tasks) == (Split.TEST, 40)
    assert config.evaluation.gate_split is Split.DEV
    fewer = learning.smollm2_config(tmp_path / "run", seed=0, rl_iterations=3, eval_tasks=10)
    assert fewer.rl.iterations == 3
