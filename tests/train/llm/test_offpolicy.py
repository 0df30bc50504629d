"""GRPO corrects for the sampler: each token is reweighted by its capped trainer/sampler ratio, and tokens
without a recorded log-prob train on-policy and are counted."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sessionrl.train.llm.data import MicroBatch, TokenSequence, Turn, merge_turns, packed
from sessionrl.train.llm.grpo import GRPOConfig, GRPOTrainer
from sessionrl.train.llm.update import token_logprobs

PROMPT = (3, 9, 4, 11)
REPLY = (7, 12, 5, 8, 2)


def tiny_model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=20,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def micro_batch(logprobs: tuple[float, ...] | None) -> MicroBatch:
    (sequence,) = merge_turns([Turn(PROMPT, REPLY, logprobs, advantage=1.0)])
    (micro,) = packed([sequence], budget=64).micro
    return micro


def trainer_logprobs(model: LlamaForCausalLM) -> tuple[float, ...]:
    """What the trainer itself gives the reply's tokens."""
    micro = micro_batch(None)
    with torch.no_grad():
        logp = token_logprobs(model, micro)[micro.loss_mask]
    return tuple(logp.tolist())


def loss_and_grads(trainer: GRPOTrainer, micro: MicroBatch) -> tuple[dict[str, float], list[torch.Tensor]]:
    loss, parts = trainer.loss(micro)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    return parts, list(torch.autograd.grad(loss, params, allow_unused=False))


def test_the_update_is_the_on_policy_one_scaled_by_the_capped_ratio() -> None:
    model = tiny_model()
    trainer = GRPOTrainer(model, GRPOConfig(is_cap=2.0), pad_id=0)
    own = trainer_logprobs(model)

    # the sampler agreed with the trainer: weight 1, nothing truncated
    same, grads_same = loss_and_grads(trainer, micro_batch(own))
    assert same["is_abs_diff"] == pytest.approx(0.0, abs=1e-6)
    assert same["is_truncated"] == 0.0
    assert same["is_missing"] == 0.0
    assert same["is_weight"] == pytest.approx(1.0, abs=1e-5)

    # the sampler gave every token e^-3 of the trainer's probability: ratio e^3 > 2, so each weight is 2
    # and the gradient is twice the on-policy one
    lower, grads_lower = loss_and_grads(trainer, micro_batch(tuple(v - 3.0 for v in own)))
    assert lower["is_abs_diff"] == pytest.approx(3.0, abs=1e-5)
    assert lower["is_truncated"] == 1.0
    assert lower["is_weight"] == pytest.approx(2.0)
    for g_lower, g_same in zip(grads_lower, grads_same, strict=True):
        torch.testing.assert_close(g_lower, 2.0 * g_same)

    # the sampler gave every token e^+0.5 of the trainer's: weight e^-0.5, below the cap
    higher, grads_higher = loss_and_grads(trainer, micro_batch(tuple(v + 0.5 for v in own)))
    assert higher["is_truncated"] == 0.0
    assert higher["is_weight"] == pytest.approx(math.exp(-0.5), rel=1e-5)
    for g_higher, g_same in zip(grads_higher, grads_same, strict=True):
        torch.testing.assert_close(g_higher, math.exp(-0.5) * g_same)


def test_tokens_without_a_recorded_logprob_train_on_policy_and_are_counted() -> None:
    model = tiny_model()
    trainer = GRPOTrainer(model, GRPOConfig(is_cap=2.0), pad_id=0)
    _, grads_same = loss_and_grads(trainer, micro_batch(trainer_logprobs(model)))
    missing, grads_missing = loss_and_grads(trainer, micro_batch(None))
    assert missing["is_missing"] == 1.0
    assert missing["is_truncated"] == 0.0
    for g_missing, g_same in zip(grads_missing, grads_same, strict=True):
        torch.testing.assert_close(g_missing, g_same)


def test_a_half_recorded_batch_reports_the_share_missing_and_epochs_share_one_anchor() -> None:
    model = tiny_model()
    trainer = GRPOTrainer(model, GRPOConfig(is_cap=2.0, epochs=2), pad_id=0)
    own = trainer_logprobs(model)
    recorded = merge_turns([Turn(PROMPT, REPLY, own, advantage=1.0)])
    rendered = merge_turns([Turn((3, 9, 4, 10), REPLY, None, advantage=-1.0)])
    stats = trainer.step([*recorded, *rendered])
    assert stats.parts["is_missing"] == pytest.approx(0.5)
    assert stats.parts["is_weight"] == pytest.approx(1.0, abs=1e-5), "over the recorded tokens alone"
    assert stats.policy_tokens == 2 * len(REPLY)
    # the second epoch's ratio is against the weights before the step, which the sampler matched: the
    # policy has moved (approx. KL > 0) but the sampler/trainer mismatch is still that of the old weights
    assert stats.parts["approx_kl"] > 0
    assert stats.parts["is_abs_diff"] == pytest.approx(0.0, abs=1e-6)


def test_the_cap_must_let_a_matching_token_keep_its_weight() -> None:
    with pytest.raises(ValueError, match="is_cap"):
        GRPOConfig(is_cap=0.9)
    assert TokenSequence((1, 2), (False, True), (0.0, -1.0), (0.0, 1.0)).recorded is None
