"""A staged run (`stages: [imitation, rl, reflection]`) interrupted in its reflection stage resumes from
the loop's last checkpoint: imitation and RL are not run again, and the reflection stage's finished
episodes are read back from the store rather than played (or reflected on) twice. The run's held-out
retries read the policy's own reflections (`reflector: policy`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import pytest

from sessionrl.episodes import RolloutConfig
from sessionrl.episodes.verdict import task_success
from sessionrl.policy.llm import SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig
from sessionrl.reflection import ANNOTATOR
from sessionrl.store import SessionStore
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
from sessionrl.train.llm.grpo import GRPOConfig
from sessionrl.train.llm.reflection import StagesResult
from sessionrl.train.llm.sft import SFTConfig

pytestmark = pytest.mark.slow
SMALL = TinyModelConfig(vocab_size=600, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)


def staged(folder: Path) -> RunConfig:
    return RunConfig(
        run_dir=folder,
        stages=("imitation", "rl", "reflection"),
        env=EnvSection(train=12, dev=2, test=3),
        model=ModelSection(tiny=SMALL),
        rollout=RolloutConfig(max_steps=3, full_schemas=False, domain_policy=False, max_tool_chars=120),
        sft=SFTSection(demos=4, trainer=SFTConfig(steps=2, batch_sessions=4, token_budget=4096)),
        rl=RLSection(
            iterations=1,
            tasks_per_iteration=2,
            sampling=SamplingConfig(max_new_tokens=12),
            trainer=GRPOConfig(group_size=2, token_budget=4096),
        ),
        evaluation=EvalSection(tasks=2, gate_tasks=2, max_new_tokens=12),
        reflection=ReflectionSection(
            tasks=3,
            held_out=2,
            trainer=SFTConfig(steps=1, batch_sessions=2, token_budget=4096),
            reflector="policy",
        ),
    )


def interrupted(*_: Any) -> NoReturn:
    raise KeyboardInterrupt


def test_an_interrupted_staged_run_resumes_after_its_last_finished_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = staged(tmp_path / "run")
    # stopped in the reflection stage, after its tries were played and reflected on
    with monkeypatch.context() as patch:
        patch.setattr("sessionrl.train.llm.reflection.corrected_retries", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run_trainer(config)
    assert (config.run_dir / "rl_policy").is_dir()
    assert not (config.run_dir / "reflection_policy").exists()
    with monkeypatch.context() as patch:
        patch.setattr("sessionrl.train.llm.loop.imitation", interrupted)  # finished: must not run again
        result = run_trainer(config, resume=True)
    assert isinstance(result, StagesResult)
    assert [r.stage for r in result.stages] == ["imitation", "rl", "reflection"]
    assert [r["iteration"] for r in result.train.curve] == [0]
    assert (config.run_dir / "reflection_policy").is_dir()
    records = [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert result.uplift is not None
    asked = [r["failed"] for r in records if r["stage"] == "self_reflection"]
    assert asked == [result.uplift.failures], "the policy was asked about each held-out failure"
    with SessionStore.open(f"sqlite:///{config.run_dir / 'sessions.db'}") as store:
        tries = [store.get(s) for s in store.session_ids() if s.startswith("s3-try-")]
    assert len(tries) == 3, "each try played once"
    failed = [s for s in tries if task_success(s) is False]
    assert failed
    for session in failed:
        reflections = [f for f in session.feedback if f.annotator == ANNOTATOR]
        assert len(reflections) == 1, "each failure reflected on once"
