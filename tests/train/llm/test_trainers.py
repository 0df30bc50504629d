"""SFT and GRPO on a tiny model: parameters move, losses fall, and checkpoints resume exactly."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from tiny_orders import SHORT_PROMPTS, OrdersWorld

from sessionrl.policy.llm import HFPolicy, LoRAConfig, SamplingConfig, with_lora
from sessionrl.policy.products import FrozenBF16Matmuls
from sessionrl.session.model import Message
from sessionrl.train.llm import update
from sessionrl.train.llm.checkpoint import LoopState, Stage, load_checkpoint, read_state, save_checkpoint
from sessionrl.train.llm.data import (
    TokenSequence,
    Turn,
    collate,
    demonstration_turns,
    merge_turns,
    packed,
)
from sessionrl.train.llm.grpo import GRPOConfig, GRPOTrainer
from sessionrl.train.llm.sft import SFTConfig, SFTTrainer
from sessionrl.train.llm.update import token_logprobs


def demos(world: OrdersWorld, policy: HFPolicy) -> list[TokenSequence]:
    return [
        seq
        for s in world.experts
        for seq in merge_turns(demonstration_turns(s, world.system, policy, SHORT_PROMPTS.max_tool_chars))
    ]


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def sampled(policy: HFPolicy, n: int) -> list[TokenSequence]:
    """`n` one-turn sequences sampled by the policy, with their recorded logprobs; advantage +1 or -1."""
    chats = [[Message(role="user", content=f"ticket {i}")] for i in range(n)]
    replies = policy.generate_now(chats)
    out = []
    for i, r in enumerate(replies):
        assert r.prompt_token_ids is not None
        assert r.token_ids is not None
        turn = Turn(r.prompt_token_ids, r.token_ids, r.logprobs, advantage=1.0 if i % 2 == 0 else -1.0)
        out += merge_turns([turn])
    return out


def sequence_logprob(policy: HFPolicy, seq: TokenSequence) -> float:
    batch = collate([seq], policy.tokenizer.pad_token_id)
    with torch.no_grad():
        return float((token_logprobs(policy.model, batch) * batch.loss_mask).sum())


def test_a_packed_row_scores_each_sequence_as_if_it_were_alone(orders_world: OrdersWorld) -> None:
    policy = orders_world.policy()
    sequences = demos(orders_world, policy)[:3]
    pad_id = policy.tokenizer.pad_token_id
    with torch.no_grad():
        (micro,) = packed(sequences, budget=1 << 20, share_prefixes=False).micro
        together = token_logprobs(policy.model, micro)[0]
        alone = torch.cat([token_logprobs(policy.model, collate([s], pad_id))[0] for s in sequences])
    assert together.shape == alone.shape
    assert torch.allclose(together, alone, atol=1e-5)
    assert int((together != 0).sum()) == sum(s.policy_tokens for s in sequences)


def test_sft_moves_the_parameters_and_lowers_the_loss(orders_world: OrdersWorld) -> None:
    policy = orders_world.policy()
    batch = demos(orders_world, policy)[:6]
    trainer = SFTTrainer(
        policy.model,
        SFTConfig(lr=1e-2, token_budget=2048, warmup_steps=0, cosine=False),
        policy.tokenizer.pad_token_id,
    )
    before = weights(policy.model)
    losses = [trainer.step(batch).loss for _ in range(8)]
    after = weights(policy.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert losses[-1] < 0.8 * losses[0]


def test_a_lora_models_base_is_multiplied_in_bf16_and_its_adapters_still_learn(
    orders_world: OrdersWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the CPU has bfloat16 units, the trainer's log-probabilities round the frozen base's products
    (as the sampler does) and keep the adapters' in float32; SFT still moves the adapters alone."""
    policy = orders_world.policy()
    policy.model = with_lora(policy.model, LoRAConfig(rank=4, alpha=8, top_blocks=1))
    batch = collate(demos(orders_world, policy)[:2], policy.tokenizer.pad_token_id)
    scored = {}
    for bf16 in (False, True):
        monkeypatch.setattr(update, "bf16_by_default", lambda _model, bf16=bf16: bf16)
        with torch.no_grad():
            scored[bf16] = token_logprobs(policy.model, batch)
    with torch.no_grad(), FrozenBF16Matmuls(policy.model):
        want = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    picked = torch.log_softmax(want[0, :-1].float(), -1).gather(-1, batch.input_ids[0, 1:, None])[:, 0]
    mask = batch.loss_mask[0, 1:]
    torch.testing.assert_close(scored[True][0, 1:][mask], picked[mask], atol=1e-5, rtol=0)
    assert not torch.equal(scored[True], scored[False])
    torch.testing.assert_close(scored[True], scored[False], atol=0.05, rtol=0)
    trainer = SFTTrainer(policy.model, SFTConfig(lr=1e-2, warmup_steps=0), policy.tokenizer.pad_token_id)
    before = weights(policy.model)
    trainer.step(demos(orders_world, policy)[:4])
    moved = {k for k, v in weights(policy.model).items() if not torch.equal(before[k], v)}
    assert moved
    assert all("lora_" in k for k in moved)


def test_grpo_raises_what_was_rewarded_and_lowers_what_was_punished(orders_world: OrdersWorld) -> None:
    policy = orders_world.policy(SamplingConfig(max_new_tokens=6, seed=1))
    batch = sampled(policy, 4)
    trainer = GRPOTrainer(policy.model, GRPOConfig(lr=3e-3, token_budget=256), policy.tokenizer.pad_token_id)
    good, bad = sequence_logprob(policy, batch[0]), sequence_logprob(policy, batch[1])
    stats = [trainer.step(batch) for _ in range(4)]
    assert sequence_logprob(policy, batch[0]) > good
    assert sequence_logprob(policy, batch[1]) < bad
    # The surrogate loss falls as the ratios move the way the advantages point (until the clip stops them).
    assert stats[-1].parts["pg_loss"] < stats[0].parts["pg_loss"]
    assert stats[0].parts["approx_kl"] == pytest.approx(0.0, abs=1e-4)  # first step: old = new policy
    assert trainer.updates == 4


def test_grpo_without_negative_weight_leaves_what_was_punished_alone(orders_world: OrdersWorld) -> None:
    policy = orders_world.policy(SamplingConfig(max_new_tokens=6, seed=1))
    punished = [seq for seq in sampled(policy, 4) if seq.advantages[-1] < 0]
    config = GRPOConfig(lr=3e-3, token_budget=256, negative_weight=0.0)
    trainer = GRPOTrainer(policy.model, config, policy.tokenizer.pad_token_id)
    before = weights(policy.model)
    stats = trainer.step(punished)
    assert stats.grad_norm == 0.0  # a punished reply alone moves nothing
    assert all(torch.equal(before[k], v) for k, v in policy.model.state_dict().items())
    assert not config.moves(punished[0].advantages)
    assert config.moves((0.0, 0.5))
    assert GRPOConfig().moves((-0.5,))
    with pytest.raises(ValueError, match="negative_weight"):
        GRPOConfig(negative_weight=1.5)


def test_grpo_with_sgd_steps_along_the_gradient(orders_world: OrdersWorld) -> None:
    policy = orders_world.policy(SamplingConfig(max_new_tokens=6, seed=1))
    batch = sampled(policy, 4)
    config = GRPOConfig(lr=0.5, token_budget=256, optimizer="sgd")
    trainer = GRPOTrainer(policy.model, config, policy.tokenizer.pad_token_id)
    assert isinstance(trainer.optimizer, torch.optim.SGD)
    good, bad = sequence_logprob(policy, batch[0]), sequence_logprob(policy, batch[1])
    before = weights(policy.model)
    trainer.step(batch)
    assert sequence_logprob(policy, batch[0]) > good
    assert sequence_logprob(policy, batch[1]) < bad
    # Unlike Adam's first step (every touched parameter moves by about lr), a parameter moves by lr times
    # its own gradient: most of them barely move.
    moved = torch.cat([(v - before[k]).abs().flatten() for k, v in policy.model.state_dict().items()])
    assert float(moved.median()) < 0.01 * config.lr
    with pytest.raises(ValueError, match="optimizer"):
        GRPOConfig(optimizer="lion")


def test_grpo_kl_penalty_keeps_a_frozen_reference(orders_world: OrdersWorld) -> None:
    policy = orders_world.policy(SamplingConfig(max_new_tokens=6))
    batch = sampled(policy, 2)
    config = GRPOConfig(lr=3e-3, kl_coef=0.5, kl_decay=0.5, token_budget=256)
    trainer = GRPOTrainer(policy.model, config, policy.tokenizer.pad_token_id)
    assert trainer.reference is not None
    frozen = weights(trainer.reference)
    first = trainer.step(batch)
    second = trainer.step(batch)
    assert first.parts["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # reference = policy before any update
    assert second.parts["kl_ref"] > 0.0
    assert trainer.beta == pytest.approx(0.5 * 0.5**2)
    assert all(torch.equal(frozen[k], v) for k, v in trainer.reference.state_dict().items())


def test_a_checkpoint_resumes_to_the_same_weights_batches_and_random_draws(
    orders_world: OrdersWorld, tmp_path: Path
) -> None:
    sequences = demos(orders_world, orders_world.policy())
    config = SFTConfig(lr=3e-3, token_budget=2048)

    def step(trainer: SFTTrainer, number: int) -> list[int]:
        """One step on a batch drawn by the global `random` generator; returns the batch's rows."""
        rows = random.sample(range(len(sequences)), 3)
        trainer.step([sequences[i] for i in rows])
        return rows

    random.seed(5)
    torch.manual_seed(5)
    policy = orders_world.policy()
    trainer = SFTTrainer(policy.model, config, policy.tokenizer.pad_token_id)
    for n in range(2):
        step(trainer, n)
    state = LoopState(stage=Stage.SFT, step=2, cursor=17, reward_cursor=21, stale=1)
    save_checkpoint(tmp_path / "ckpt", policy.model, trainer.optimizer, state, {"sampling": policy.generator})
    rows = step(trainer, 2)
    expected, expected_draw = weights(policy.model), torch.rand(3)
    expected_sample = torch.randint(0, 1000, (1,), generator=policy.generator)

    fresh = orders_world.policy()
    resumed = SFTTrainer(fresh.model, config, fresh.tokenizer.pad_token_id)
    random.seed(99)  # whatever the process did before, loading puts the state back
    loaded = load_checkpoint(tmp_path / "ckpt", fresh.model, resumed.optimizer, {"sampling": fresh.generator})
    assert loaded == state == read_state(tmp_path / "ckpt")
    resumed.steps = loaded.step  # the learning-rate schedule goes on from the step saved, as the loop does
    assert step(resumed, 2) == rows
    assert all(torch.equal(expected[k], v) for k, v in weights(fresh.model).items())
    assert torch.equal(torch.rand(3), expected_draw)
    assert torch.equal(torch.randint(0, 1000, (1,), generator=fresh.generator), expected_sample)


def test_saving_again_replaces_the_checkpoint_whole(orders_world: OrdersWorld, tmp_path: Path) -> None:
    policy = orders_world.policy()
    save_checkpoint(tmp_path / "c", policy.model, None, LoopState(step=1))
    save_checkpoint(tmp_path / "c", policy.model, None, LoopState(step=2))
    assert read_state(tmp_path / "c") == LoopState(step=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
    with pytest.raises(FileNotFoundError, match=r"state\.json"):
        load_checkpoint(tmp_path / "missing", policy.model, None)


def test_a_checkpoint_with_running_totals_in_counters_still_reads(tmp_path: Path) -> None:
    """Checkpoints written before the totals became fields kept them in a `counters` mapping."""
    loop = {"stage": "rl", "step": 3, "policy_version": 3, "cursor": 40, "curve": [{"iteration": 0}]}
    loop["counters"] = {"reward_cursor": 44, "updates": 3, "stale": 2, "trained_sessions": 24}
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "state.json").write_text(json.dumps({"loop": loop, "python_random": []}))
    state = read_state(tmp_path / "c")
    assert state == LoopState(
        stage=Stage.RL,
        step=3,
        policy_version=3,
        cursor=40,
        reward_cursor=44,
        updates=3,
        stale=2,
        trained_sessions=24,
        curve=({"iteration": 0},),
    )
