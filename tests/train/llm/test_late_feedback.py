"""Late feedback trains: a session whose verdict arrives after its iteration is held by the reward shaper,
read by the trainer later, ranked against its whole group, corrected from the policy that sampled it,
and counted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from sessionrl.episodes import RolloutConfig
from sessionrl.policy.llm import SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig
from sessionrl.session.events import FeedbackAdded
from sessionrl.session.model import Feedback, FeedbackType
from sessionrl.train.config import EnvSection, EvalSection, ModelSection, RLSection, RunConfig, SFTSection
from sessionrl.train.llm.data import lag
from sessionrl.train.llm.evaluation import in_lockstep
from sessionrl.train.llm.feed import VERDICT_DUE, GroupMemory, RewardShaper, read_scored
from sessionrl.train.llm.grpo import GRPOConfig
from sessionrl.train.llm.loop import learn, resumed_policy, rl_specs, start_rl, train
from sessionrl.train.llm.run import Run, open_run
from sessionrl.train.llm.sft import SFTConfig

pytestmark = pytest.mark.slow
SMALL = TinyModelConfig(vocab_size=700, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def late_run(folder: Path, late_share: float = 0.0) -> RunConfig:
    """Imitation and the gate only (RL is driven by the test), two tasks of two sessions per iteration."""
    return RunConfig(
        run_dir=folder,
        env=EnvSection(train=16, dev=4, test=4),
        model=ModelSection(tiny=SMALL),
        rollout=RolloutConfig(max_steps=3, full_schemas=False, domain_policy=False, max_tool_chars=120),
        sft=SFTSection(demos=6, trainer=SFTConfig(steps=3, batch_sessions=4, token_budget=4096)),
        rl=RLSection(
            iterations=0,
            tasks_per_iteration=2,
            max_lag=1,
            late_share=late_share,
            late_after=1,
            sampling=SamplingConfig(max_new_tokens=16),
            trainer=GRPOConfig(group_size=2, token_budget=4096),
        ),
        evaluation=EvalSection(tasks=2, gate_tasks=2, max_new_tokens=16),
    )


def judge(run: Run, session_id: str, solved: bool) -> None:
    """A verdict that replaces the checker's (the latest counts), as an annotator's would."""
    verdict = Feedback(type=FeedbackType.TASK_OUTCOME, score=float(solved), annotator="reviewer")
    run.store.append(session_id, FeedbackAdded(feedback=verdict))


def test_a_session_judged_late_trains_later_off_policy_and_is_counted(tmp_path: Path) -> None:
    config = late_run(tmp_path / "run")
    train(config)
    with open_run(config) as run:
        policy = run.policy = resumed_policy(run)
        trainer = start_rl(run, resume=True)
        memory = GroupMemory()
        specs = rl_specs(run, 0)
        peer, late_id = str(specs[0].session_id), str(specs[1].session_id)  # one group of two
        specs[1] = dataclasses.replace(specs[1], metadata={**specs[1].metadata, VERDICT_DUE: 1})
        in_lockstep(run, specs, policy)
        judge(run, peer, solved=False)

        # iteration 0: the late session is held; its peer and the other group train
        cursor, _ = run.shaper.follow(run.state.reward_cursor, now=0)
        assert run.shaper.held == {late_id: 1}
        assert [bool(run.store.rewards(str(s.session_id))) for s in specs] == [True, False, True, True]
        first = learn(run, trainer, memory=memory)
        assert late_id not in first.session_ids
        assert (len(first.session_ids), first.late) == (3, 0)
        resumed = RewardShaper(run.shaper.engine, run.store)  # a resume finds what it must still hold
        assert (resumed.recall(1), resumed.held) == (1, {late_id: 1})

        # the policy moves on, as an update would move it, and serves the next version
        policy.version += 1
        torch.manual_seed(0)
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(0.05 * torch.randn_like(p))

        # iteration 1: its verdict arrives (solved), the shaper scores it, the trainer reads it
        judge(run, late_id, solved=True)
        before = run.state.cursor
        _, scored = run.shaper.follow(cursor, now=1)
        assert (scored, run.shaper.held) == (1, {})
        assert read_scored(run.store, before, stage="rl", version=1, max_lag=0).stale == 1, "dropped at lag 0"
        second = learn(run, trainer, memory=memory)
        assert second.session_ids == (late_id,)
        assert second.late == 1

        session = run.store.get(late_id)
        assert {c.policy_version for c in session.llm_calls} == {0}
        assert lag(session, policy.version) == 1
        # ranked against its peer (failed, trained at iteration 0), it beat its group, so it trains
        assert second.stats is not None
        parts = second.stats.parts
        assert parts["is_missing"] == 0.0, "every token carries the log-prob stored when it was sampled"
        assert parts["is_abs_diff"] > 1e-3, "corrected from version 0, not from the trainer's own weights"
        assert 0.0 < parts["is_weight"] <= trainer.config.is_cap


def test_late_share_marks_sessions_for_a_later_iteration(tmp_path: Path) -> None:
    config = late_run(tmp_path / "run", late_share=0.5)
    with open_run(config) as run:
        specs = [s for i in range(8) for s in rl_specs(run, i)]
    due = [(s.metadata["iteration"], s.metadata.get(VERDICT_DUE)) for s in specs]
    late = [(i, d) for i, d in due if d is not None]
    assert all(d == i + 1 for i, d in late)
    assert 0.25 < len(late) / len(specs) < 0.75  # 32 draws at 0.5
    with open_run(late_run(tmp_path / "none")) as run:
        assert all(VERDICT_DUE not in s.metadata for s in rl_specs(run, 0))
