"""Shared prefixes: the trie rebuilds every sequence, and a shared layout trains exactly as the unshared."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from sessionrl.train.llm.data import MicroBatch, TokenSequence, collate, packed
from sessionrl.train.llm.prefixes import chunk_shared, key_order, prefix_tree, shareable
from sessionrl.train.llm.update import token_logprobs
from sessionrl.train.losses import clipped_pg_loss

token_lists = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=8), max_size=12)


@given(token_lists, st.data())
def test_each_sequence_is_its_ancestors_then_its_leaf_and_shared_tokens_lie_once(
    sequences: list[list[int]], data: st.DataObject
) -> None:
    keys = [s[: data.draw(st.integers(0, len(s) - 1))] for s in sequences]
    tree = prefix_tree(keys, [len(s) for s in sequences])
    leaves = [t for t in tree if t.end == len(sequences[t.sequence]) and not _has_child(tree, t)]
    assert sorted(t.sequence for t in leaves) == list(range(len(sequences)))
    for leaf in leaves:
        rebuilt: list[int] = []
        for node in _chain(tree, leaf):
            assert node.start == len(rebuilt)  # positions continue the context
            rebuilt += sequences[node.sequence][node.start : node.end]
        assert rebuilt == sequences[leaf.sequence]
    _, common = key_order(keys)
    assert sum(t.end - t.start for t in tree) == sum(map(len, sequences)) - sum(common)


def _has_child(tree: list, node: object) -> bool:
    index = tree.index(node)
    return any(t.parent == index for t in tree)


def _chain(tree: list, leaf: object) -> list:
    chain, at = [leaf], tree.index(leaf)
    while tree[at].parent >= 0:
        at = tree[at].parent
        chain.append(tree[at])
    return chain[::-1]


def test_a_key_as_long_as_its_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match="shorter"):
        prefix_tree([(1, 2)], [2])


def test_micro_batches_hold_what_they_compute_within_the_budget() -> None:
    keys = [(1, 2, 3, 4), (1, 2, 3, 5), (1, 2, 9), (7, 7)]
    lengths = [10, 10, 8, 6]
    # in key order; a sequence costs its length less what it shares with the one before it
    assert chunk_shared(keys, lengths, budget=16) == [[0], [1, 2], [3]]  # 10 + 7 > 16; 10 + 6
    assert chunk_shared(keys, lengths, budget=17) == [[0, 1], [2, 3]]  # 10 + 7; 8 + 6


# a tiny model trains the same on shared and unshared layouts


def group_sequences() -> list[TokenSequence]:
    """Two GRPO groups (three completions each) whose prompts begin alike, a multi-turn sequence, a
    duplicate, and one sequence sharing nothing; advantages and old logprobs differ per sequence."""
    system = [1, 5, 6, 7, 8, 9, 10]
    prompts = [[*system, 11, 12, 13, 14], [*system, 15, 16, 17]]
    completions = [[20, 21, 22], [20, 23], [24, 25, 26, 27]]
    out = []
    for p, prompt in enumerate(prompts):
        for c, completion in enumerate(completions):
            out.append(_sequence(prompt, [completion], advantage=1.0 - p - 0.5 * c, seed=3 * p + c))
    out.append(_sequence([*system, 11, 12], [[30, 31], [32, 33, 34]], advantage=0.7, seed=9))
    out.append(out[0])
    out.append(_sequence([2, 40, 41], [[42, 43]], advantage=-0.3, seed=10))
    return out


def _sequence(prompt: list[int], replies: list[list[int]], advantage: float, seed: int) -> TokenSequence:
    """`prompt`, then each reply followed by a two-token tool answer (the replies are policy tokens)."""
    ids, mask = list(prompt), [False] * len(prompt)
    for reply in replies:
        ids += [*reply, 44, 45]
        mask += [True] * len(reply) + [False, False]
    draws = torch.Generator().manual_seed(seed)
    old = [-float(torch.rand(1, generator=draws)) if m else 0.0 for m in mask]
    return TokenSequence(tuple(ids), tuple(mask), tuple(old), tuple(advantage if m else 0.0 for m in mask))


def tiny_model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def loss_and_grads(model: LlamaForCausalLM, micro: list[MicroBatch]) -> tuple[float, list[torch.Tensor]]:
    """The token-mean clipped policy-gradient loss over every micro-batch, and its parameter gradients."""
    model.zero_grad(set_to_none=True)
    total = sum(m.policy_tokens for m in micro)
    loss = torch.zeros(())
    for m in micro:
        logp = token_logprobs(model, m)
        pg = clipped_pg_loss(logp, m.old_logprobs, m.advantages, m.loss_mask, 0.2)
        loss = loss + pg.loss * m.policy_tokens / total
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_a_shared_prefix_gives_the_loss_and_gradients_of_each_sequence_alone() -> None:
    sequences = group_sequences()
    shared = packed(sequences, budget=1 << 16)
    alone = packed(sequences, budget=1 << 16, share_prefixes=False)
    assert shared.computed < alone.computed == shared.tokens == sum(map(len, sequences))
    assert shared.policy_tokens == alone.policy_tokens == sum(s.policy_tokens for s in sequences)
    (micro,) = shared.micro
    assert micro.parents is not None
    assert int((micro.parents >= 0).sum()) > len(sequences) // 2
    model = tiny_model()
    loss_shared, grads_shared = loss_and_grads(model, list(shared))
    loss_alone, grads_alone = loss_and_grads(model, list(alone))
    loss_padded, grads_padded = loss_and_grads(model, [collate(sequences, pad_id=0)])
    assert loss_shared == pytest.approx(loss_alone, abs=1e-6)
    assert loss_shared == pytest.approx(loss_padded, abs=1e-6)
    assert len(grads_shared) == len(grads_alone) == len(grads_padded)
    for shared_grad, alone_grad, padded_grad in zip(grads_shared, grads_alone, grads_padded, strict=True):
        assert torch.allclose(shared_grad, alone_grad, atol=1e-6, rtol=1e-4)
        assert torch.allclose(shared_grad, padded_grad, atol=1e-6, rtol=1e-4)


def test_only_tokens_before_the_one_predicting_the_first_policy_token_are_shared() -> None:
    a = TokenSequence((1, 2, 3, 4), (False, False, True, True), (0.0,) * 4, (0.0, 0.0, 1.0, 1.0))
    b = TokenSequence((1, 2, 3, 5), (False, False, True, True), (0.0,) * 4, (0.0, 0.0, -1.0, -1.0))
    assert shareable(a.loss_mask) == 1
    (micro,) = packed([a, b], budget=64).micro
    assert micro.input_ids.tolist() == [[1, 2, 3, 4, 2, 3, 5]]
    assert micro.loss_mask.tolist() == [[False, False, True, True, False, True, True]]
    assert micro.advantages[0, 5:].tolist() == [-1.0, -1.0]
