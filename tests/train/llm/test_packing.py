"""Segment attention: a packed row attends exactly as its sequences would one by one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.nn import functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from sessionrl.train.llm.data import TokenSequence, packed
from sessionrl.train.llm.packing import (
    length_buckets,
    plan_segments,
    segment_attention,
    use_packed_attention,
)
from sessionrl.train.llm.update import token_logprobs


def test_each_segment_attends_causally_to_itself_alone_whatever_its_bucket() -> None:
    lengths = [5, 40, 3, 22, 1]  # buckets [40, 22] and [5, 3] padded to their longest, then [1]
    assert len(length_buckets(lengths)) == 3
    n = sum(lengths)
    torch.manual_seed(0)
    query, key, value = (torch.randn(1, 2, n, 8, requires_grad=True) for _ in range(3))
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    module = SimpleNamespace(num_key_value_groups=1)
    packed, _ = segment_attention(module, query, key, value, None, scaling=0.5, cu_seq_lens_q=bounds)
    alone = torch.cat(
        [
            F.scaled_dot_product_attention(
                query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True, scale=0.5
            )
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
        ],
        dim=2,
    ).transpose(1, 2)
    assert packed.shape == (1, n, 2, 8)
    assert torch.allclose(packed, alone, atol=1e-6)
    (grad_packed,) = torch.autograd.grad(packed.square().sum(), key)
    (grad_alone,) = torch.autograd.grad(alone.square().sum(), key)
    assert torch.allclose(grad_packed, grad_alone, atol=1e-5)


def test_segment_attention_refuses_a_mask_or_missing_boundaries() -> None:
    x = torch.zeros(1, 1, 4, 2)
    with pytest.raises(ValueError, match="boundaries"):
        segment_attention(SimpleNamespace(), x, x, x, None)
    with pytest.raises(ValueError, match="no mask"):
        segment_attention(SimpleNamespace(), x, x, x, torch.ones(1, 4), cu_seq_lens_q=torch.tensor([0, 4]))


def test_a_segment_sees_its_parents_context_then_its_parent_then_itself() -> None:
    # segments [0, 3) root, [3, 5) after it, [5, 6) after that, [6, 8) after the root
    plan = plan_segments([0, 3, 5, 6, 8], [-1, 0, 1, 0], torch.device("cpu"))
    seen: dict[int, list[int]] = {}
    for group in plan.groups:
        for row in range(group.query.shape[0]):
            for slot in range(int(group.real[row].sum())):
                visible = group.key[row] if group.mask is None else group.key[row][group.mask[row, 0, slot]]
                if group.mask is None:
                    visible = visible[: slot + 1]
                seen[int(group.query[row, slot])] = sorted(set(visible.tolist()))
    assert seen == {
        0: [0],
        1: [0, 1],
        2: [0, 1, 2],
        3: [0, 1, 2, 3],
        4: [0, 1, 2, 3, 4],
        5: [0, 1, 2, 3, 4, 5],
        6: [0, 1, 2, 6],
        7: [0, 1, 2, 6, 7],
    }
    assert sorted(plan.positions.tolist()) == list(range(8))
    with pytest.raises(ValueError, match="does not come before"):
        plan_segments([0, 2, 4], [1, -1], torch.device("cpu"))


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def test_switched_to_the_packed_attention_a_padded_batch_and_a_cached_decode_are_unchanged() -> None:
    model = tiny_llama()
    ids = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 3, 4, 5]])  # the second row left-padded
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
        before_decoded = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
        use_packed_attention(model)
        after = model(input_ids=ids, attention_mask=mask).logits
        after_decoded = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert torch.equal(before[mask.bool()], after[mask.bool()])
    assert torch.equal(before_decoded, after_decoded)


class DeafLlama(LlamaForCausalLM):
    """A model whose attention cannot be switched (as transformers leaves models off its interface)."""

    def set_attn_implementation(self, *_: Any, **__: Any) -> None:
        return None


def test_a_model_that_ignores_the_packed_attention_is_refused_not_trained_across_sequences() -> None:
    model = DeafLlama(tiny_llama().config)
    a = TokenSequence((1, 2, 3), (False, False, True), (0.0, 0.0, -1.0), (0.0, 0.0, 1.0))
    b = TokenSequence((4, 5, 6), (False, True, True), (0.0, -1.0, -1.0), (0.0, 1.0, 1.0))
    (micro,) = packed([a, b], budget=64, share_prefixes=False).micro
    with pytest.raises(RuntimeError, match="did not take the packed attention"):
        token_logprobs(model, micro)
