"""Reflection on a policy trained elsewhere: a staged run of no GRPO iterations that loads its policy by
`model.path` reflects on that policy (its `sft` export), through LoRA adapters when the config has them,
and measures CU against it (as `bench/reflection.py --model smollm2` runs it); a run stopped at the gate
reflects on nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

import reflection as bench  # bench/reflection.py
from sessionrl.episodes import RolloutConfig
from sessionrl.policy.llm import LoRAConfig, SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig
from sessionrl.train.config import (
    EnvSection,
    EvalSection,
    ModelSection,
    ReflectionSection,
    RLSection,
    RunConfig,
    SFTSection,
)
from sessionrl.train.dispatch import run_trainer
from sessionrl.train.llm.checkpoint import Stage
from sessionrl.train.llm.reflection import StagesResult
from sessionrl.train.llm.sft import SFTConfig

pytestmark = pytest.mark.slow
SMALL = TinyModelConfig(vocab_size=600, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32)


def config(folder: Path, model: ModelSection, *, steps: int, gate: float = 0.0) -> RunConfig:
    """A small staged run of no GRPO iterations."""
    return RunConfig(
        run_dir=folder,
        stages=("imitation", "rl", "reflection"),
        env=EnvSection(train=12, dev=2, test=3),
        model=model,
        rollout=RolloutConfig(max_steps=3, full_schemas=False, domain_policy=False, max_tool_chars=120),
        sft=SFTSection(demos=4, trainer=SFTConfig(steps=steps, batch_sessions=4, token_budget=4096)),
        rl=RLSection(iterations=0, sampling=SamplingConfig(max_new_tokens=12)),
        evaluation=EvalSection(tasks=2, gate_tasks=2, gate_min_success=gate, max_new_tokens=12),
        reflection=ReflectionSection(
            tasks=3, held_out=2, trainer=SFTConfig(lr=0.01, steps=2, batch_sessions=2, token_budget=4096)
        ),
    )


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A policy imitated in a run of its own: what the staged runs load."""
    folder = tmp_path_factory.mktemp("elsewhere")
    run_trainer(config(folder, ModelSection(tiny=SMALL), steps=4).model_copy(update={"stages": None}))
    return folder / "sft_policy"


def test_a_run_of_no_grpo_iterations_reflects_on_the_policy_it_loaded(trained: Path, tmp_path: Path) -> None:
    lora = LoRAConfig(rank=2, alpha=4, top_blocks=1)
    cfg = config(tmp_path / "run", ModelSection(path=trained, lora=lora), steps=0)
    result = run_trainer(cfg)
    assert isinstance(result, StagesResult)
    assert [r.stage for r in result.stages] == ["imitation", "reflection"]
    assert not (cfg.run_dir / "rl_policy").exists()
    assert result.uplift is not None
    # reflection started from the loaded policy: no imitation step moved it, and the stage's LoRA update
    # touched the top block alone
    loaded, start = weights(trained), weights(cfg.run_dir / "sft_policy")
    assert all(torch.equal(loaded[name], start[name]) for name in loaded)
    after = weights(cfg.run_dir / "reflection_policy")
    moved = {name for name in loaded if not torch.equal(loaded[name], after[name])}
    assert moved, "the reflection stage changed no weight"
    assert all(".layers.1." in name for name in moved), sorted(moved)
    # bench/reflection.py --model smollm2 reports such a run: stage 2 is the loaded policy
    figures = bench.summary(result, Console(quiet=True))
    assert figures["stage1_success"] is None
    assert figures["stage2_success"] == result.stages[0].metrics.success
    assert figures["stage3_success"] == result.stages[1].metrics.success
    assert figures["held_out_failures"] == result.uplift.failures
    # the control: the reflection policy retried every failure without a reflection too, on its tasks
    plain = result.uplift.trained_without_reflection
    assert len(plain) == result.uplift.failures
    requests = [(s.metadata["task_id"], s.user_query) for s in plain]
    assert requests == [(s.metadata["task_id"], s.user_query) for s in result.uplift.without]  # no reflection
    read = result.uplift.read()
    assert read is not None
    assert figures["read_cu"] == read.second_rate - read.first_rate


def test_a_run_stopped_at_the_gate_reflects_on_nothing(trained: Path, tmp_path: Path) -> None:
    cfg = config(tmp_path / "run", ModelSection(path=trained), steps=0, gate=1.0)
    result = run_trainer(cfg)
    assert isinstance(result, StagesResult)
    assert result.train.stage is Stage.STOPPED
    assert result.uplift is None
    assert not (cfg.run_dir / "reflection_policy").exists()
