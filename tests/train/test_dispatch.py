"""`sessionrl train CONFIG` runs every trainer: each example config, made tiny, trains, exports a policy whose
parameters moved, logs its metrics and ends with the report's evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.session.model import FeedbackType
from sessionrl.store import SessionStore
from sessionrl.train.config import EnvSection, RunConfig
from sessionrl.train.dispatch import run_trainer
from tiny_run_support import SFT_SECTION, merged, tiny_run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

TINY_LLM = tiny_run(sft=SFT_SECTION)
TINY: dict[str, dict[str, Any]] = {
    "sft": TINY_LLM,
    "grpo": TINY_LLM
    | {
        "evaluation": TINY_LLM["evaluation"] | {"gate_min_success": 0.0},
        "rl": {
            "iterations": 1,
            "tasks_per_iteration": 2,
            "sampling": {"max_new_tokens": 16},
            "trainer": {"group_size": 2, "token_budget": 4096},
        },
    },
    "dpo": TINY_LLM
    | {
        "dpo": {
            "tasks": 2,
            "episodes_per_task": 2,
            "sampling": {"max_new_tokens": 16},
            "trainer": {"steps": 2, "batch_size": 2},
        }
    },
}
TINY_STRUCTURED: dict[str, Any] = {
    "imitation": {"demos": 4, "epochs": 2},
    "trainer": {
        "run": {"iterations": 2, "num_envs": 2, "rollout_steps": 16},
        "update": {"epochs": 1, "minibatches": 2},
    },
}
TINY |= {
    name: {"env": {"train": 24, "dev": 0, "test": 4}, "evaluation": {"tasks": 3}, name: TINY_STRUCTURED}
    for name in ("ppo", "aaac")
}
TRAINED = {"sft": ("base", "sft"), "grpo": ("sft", "rl"), "dpo": ("sft", "dpo")}
"""The LLM trainers' policy folders (`<name>_policy`, or `base/`) before and after the trainer's updates."""


def tiny_config(trainer: str, folder: Path) -> Path:
    """The trainer's example config with the sizes of `TINY`, running in `folder/run`."""
    example = yaml.safe_load((EXAMPLES / f"orders-{trainer}.yaml").read_text())
    data = merged(example, TINY[trainer] | {"run_dir": str(folder / "run")})
    path = folder / f"{trainer}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of a policy folder's `model.safetensors`."""
    return load_file(str(folder / "model.safetensors"))


def moved(before: Path, after: Path) -> bool:
    """Whether any weight differs between two exported policies."""
    old, new = weights(before), weights(after)
    assert old.keys() == new.keys()
    return any(not torch.equal(old[k], new[k]) for k in old)


def train_cli(config: Path) -> str:
    """Run `sessionrl train CONFIG`; its output (the run must succeed)."""
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A tiny DPO run through the CLI (shared: its pairs are checked apart): its folder and its output."""
    folder = tmp_path_factory.mktemp("dpo")
    return folder / "run", train_cli(tiny_config("dpo", folder))


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["sft", "grpo", "dpo"])
def test_an_llm_trainer_runs_from_the_cli(
    trainer: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if trainer == "dpo":
        run_dir, output = request.getfixturevalue("dpo_run")
    else:
        output = train_cli(tiny_config(trainer, tmp_path))
        run_dir = tmp_path / "run"
    before, after = TRAINED[trainer]
    start = run_dir / before if before == "base" else run_dir / f"{before}_policy"
    assert moved(start, run_dir / f"{after}_policy")
    assert f"trainer: {trainer}" in output
    evaluated = {r["label"] for r in records(run_dir) if r["stage"] == "eval"}
    assert {before, after} - {"base"} <= evaluated
    assert RunConfig.load(run_dir / "config.yaml").trainer == trainer


@pytest.mark.slow
def test_a_dpo_run_stores_its_pairs_as_preference_feedback(dpo_run: tuple[Path, str]) -> None:
    """The barely trained policy solves no task here, and each of its episodes parts from the expert's
    demonstration: one pair per sampled episode."""
    run_dir, _ = dpo_run
    (pairs,) = [r for r in records(run_dir) if r["stage"] == "pairs"]
    steps = [r for r in records(run_dir) if r["stage"] == "dpo"]
    assert pairs["episodes"] == 2 * 2
    assert pairs["pairs"] == pairs["episodes"] - pairs["solved"] >= 1
    assert len(steps) == 2
    with SessionStore.open(f"sqlite:///{run_dir / 'sessions.db'}") as store:
        feedback = [
            f
            for sid in store.session_ids()
            if sid.startswith("dpo-")
            for f in store.get(sid).feedback
            if f.type is FeedbackType.PREFERENCE
        ]
    assert len(feedback) == pairs["pairs"]
    assert all(f.annotator == "outcome" and "rejected_call_id" in f.data for f in feedback)


@pytest.mark.parametrize("trainer", ["ppo", "aaac"])
def test_a_structured_trainer_runs_from_the_cli(trainer: str, tmp_path: Path) -> None:
    output = train_cli(tiny_config(trainer, tmp_path))
    run_dir = tmp_path / "run"
    assert moved(run_dir / "imitation_policy", run_dir / f"{trainer}_policy")
    assert [r["step"] for r in records(run_dir) if r["stage"] == "imitation"] == [0, 1]
    rounds = [r for r in records(run_dir) if r["stage"] == trainer]
    assert [r["env_steps"] for r in rounds] == [32, 64]
    report = {r["label"]: r for r in records(run_dir) if r["stage"] == "eval"}
    assert set(report) == {"imitation", trainer}
    assert all(r["episodes"] == 3 for r in report.values())
    assert f"trainer: {trainer}" in output
    # the eval command reads the exported policies back: the same greedy report on the same tasks
    again = CliRunner().invoke(app, ["eval", str(run_dir)])
    assert again.exit_code == 0, again.output
    evaluated = json.loads(again.output.strip().splitlines()[-1])
    assert evaluated == {label: {k: r[k] for k in evaluated[label]} for label, r in report.items()}


def test_only_checkpointed_trainers_resume(tmp_path: Path) -> None:
    config = RunConfig.load(tiny_config("ppo", tmp_path))
    with pytest.raises(ValueError, match="only sft and grpo runs resume"):
        run_trainer(config, resume=True)


def test_a_structured_trainer_needs_a_structured_environment(tmp_path: Path, retail_data: Path) -> None:
    config = RunConfig.load(tiny_config("ppo", tmp_path))
    retail = config.model_copy(update={"env": EnvSection(name="retail", options={"data": retail_data})})
    with pytest.raises(ValueError, match="Gymnasium view"):
        run_trainer(retail)
