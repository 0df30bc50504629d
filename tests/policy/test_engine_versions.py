"""Policy versions through the torch engine: a sample after an update carries the new version and comes
from the new weights (nothing kept from the old ones is reused), and the trainer leaves out, counts and
says the sessions sampled more than `rl.max_lag` versions ago, failing when nothing fresh is left."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
import torch
from rich.console import Console

from sessionrl.episodes import RolloutConfig
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.sampling import TorchEngine
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_model, train_tokenizer
from sessionrl.train.config import EnvSection, EvalSection, ModelSection, RLSection, RunConfig, SFTSection
from sessionrl.train.llm.evaluation import in_lockstep
from sessionrl.train.llm.feed import StaleFeed
from sessionrl.train.llm.grpo import GRPOConfig, GRPOTrainer
from sessionrl.train.llm.imitation import imitation
from sessionrl.train.llm.loop import learn, rl_specs
from sessionrl.train.llm.run import Run, open_run
from sessionrl.train.llm.sft import SFTConfig

CONFIG = TinyModelConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
SMALL = TinyModelConfig(vocab_size=700, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def test_a_sample_after_an_update_carries_the_new_version_and_the_new_weights() -> None:
    tokenizer = train_tokenizer(["a b c d e f g"] * 4, CONFIG)
    model = build_tiny_model(CONFIG, tokenizer)
    policy = HFPolicy(model, tokenizer, SamplingConfig(max_new_tokens=5, temperature=0.0))
    prompt = [(7 * i) % 250 + 10 for i in range(70)]
    prompts = [[*prompt, 11], [*prompt, 12]]
    before = policy.sample_prompts(prompts)
    assert {r.policy_version for r in before} == {0}
    with torch.no_grad():  # an optimiser step: the weights change in place
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    policy.version += 1
    after = policy.sample_prompts(prompts)
    assert {r.policy_version for r in after} == {1}
    for reply in after:
        ids = [*(reply.prompt_token_ids or ()), *(reply.token_ids or ())]
        n = len(reply.prompt_token_ids or ())
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, n - 1 : -1]
        expected = (
            torch.log_softmax(logits, -1).gather(-1, torch.tensor(reply.token_ids)[:, None]).squeeze(-1)
        )
        # bfloat16 products (the default where the CPU has the units) stay within 0.02 nats of float32;
        # stale copies of the old weights would not (the step moved every weight by about 0.05)
        tolerance = 0.02 if isinstance(policy.engine, TorchEngine) and policy.engine.bf16 else 1e-4
        assert list(reply.logprobs or ()) == pytest.approx(expected.tolist(), abs=tolerance)


def small_run(folder: Path) -> RunConfig:
    return RunConfig(
        run_dir=folder,
        env=EnvSection(train=16, dev=4, test=4),
        model=ModelSection(tiny=SMALL),
        rollout=RolloutConfig(max_steps=2, full_schemas=False, domain_policy=False, max_tool_chars=120),
        sft=SFTSection(demos=4, trainer=SFTConfig(steps=1, batch_sessions=4, token_budget=4096)),
        rl=RLSection(
            iterations=3,
            tasks_per_iteration=2,
            max_lag=2,
            sampling=SamplingConfig(max_new_tokens=8),
            trainer=GRPOConfig(group_size=2, token_budget=4096),
        ),
        evaluation=EvalSection(tasks=2, gate_tasks=2, max_new_tokens=8),
    )


def rollout_at(run: Run, iteration: int, version: int) -> None:
    """Iteration `iteration`'s episodes sampled by the policy as version `version`, then scored."""
    policy = run.need_policy()
    policy.version = version
    in_lockstep(run, rl_specs(run, iteration), policy)
    cursor, _ = run.shaper.follow(run.state.reward_cursor)
    run.state = dataclasses.replace(run.state, reward_cursor=cursor)


def test_sessions_older_than_max_lag_are_dropped_counted_and_said(tmp_path: Path) -> None:
    with open_run(small_run(tmp_path / "run")) as run:
        imitation(run, Console(quiet=True), resume=False)
        policy = run.need_policy()
        trainer = GRPOTrainer(policy.model, run.config.rl.trainer, policy.tokenizer.pad_token_id)
        rollout_at(run, 0, version=0)
        rollout_at(run, 1, version=1)
        policy.version = 3  # two updates later: version 0's sessions are 3 behind, version 1's 2
        said = io.StringIO()
        learned = learn(run, trainer, Console(file=said, width=200))
        assert (learned.read.stale, len(learned.read.fresh)) == (4, 4)
        assert all(s.startswith("rl-0001-") for s in learned.session_ids)
        assert (
            "dropped 4 of 8 scored sessions: sampled more than rl.max_lag=2 policy versions ago"
            in said.getvalue()
        )
        assert run.state.stale == 4  # saved with the checkpoint, and logged in the iteration's record
        # sessions arriving only stale: the trainer would learn nothing, so it stops
        rollout_at(run, 2, version=3)
        policy.version = 6
        with pytest.raises(StaleFeed, match=r"dropped 4 of 4 .* none was fresh"):
            learn(run, trainer, Console(quiet=True))
