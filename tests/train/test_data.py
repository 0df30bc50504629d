"""Sessions to token sequences: loss masks, merging, advantages, staleness, packing and padding."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny_orders import SHORT_PROMPTS, OrdersWorld

from sessionrl.policy.llm import final_action, tool_action
from sessionrl.session.model import LLMCall, Session, utcnow
from sessionrl.train.data import (
    Turn,
    call_advantages,
    collate,
    demonstration_turns,
    fixed_batches,
    lag,
    merge_turns,
    pack,
    packed,
    padding_fraction,
    policy_turns,
    session_advantages,
)


def _session(*calls: LLMCall) -> Session:
    now = utcnow()
    return Session(
        session_id="s",
        trace_id="0" * 31 + "1",
        user_query="q",
        llm_calls=calls,
        created_at=now,
        updated_at=now,
    )


def test_loss_mask_covers_exactly_the_generated_tokens_of_nested_turns() -> None:
    first = Turn(prompt=(10, 11, 12), completion=(20, 21), logprobs=(-1.0, -2.0), advantage=0.5)
    second = Turn(prompt=(10, 11, 12, 20, 21, 30, 31), completion=(40,), logprobs=(-3.0,), advantage=0.5)
    (seq,) = merge_turns([first, second], "s")
    assert seq.input_ids == (10, 11, 12, 20, 21, 30, 31, 40)
    assert [t for t, m in zip(seq.input_ids, seq.loss_mask, strict=True) if m] == [20, 21, 40]
    assert seq.old_logprobs == (0, 0, 0, -1.0, -2.0, 0, 0, -3.0)
    assert seq.advantages == (0, 0, 0, 0.5, 0.5, 0, 0, 0.5)
    assert seq.policy_tokens == 3


def test_a_prompt_that_does_not_extend_the_sequence_starts_a_new_one() -> None:
    first = Turn(prompt=(1, 2), completion=(3,))
    truncated = Turn(prompt=(1, 9, 9), completion=(4, 5))  # history dropped: not a continuation
    sequences = merge_turns([first, truncated])
    assert [s.input_ids for s in sequences] == [(1, 2, 3), (1, 9, 9, 4, 5)]
    assert [s.policy_tokens for s in sequences] == [1, 2]


def test_demonstration_masks_are_exactly_the_expert_actions(orders_world: OrdersWorld) -> None:
    policy = orders_world.policy()
    session = next(s for s in orders_world.experts if len(s.tool_calls) >= 3)
    turns = demonstration_turns(session, orders_world.system, policy, SHORT_PROMPTS.max_tool_chars)
    (seq,) = merge_turns(turns, session.session_id)  # the turns nest: one sequence per session
    trained = [t for t, m in zip(seq.input_ids, seq.loss_mask, strict=True) if m]
    actions = [tool_action(c.tool, c.params) for c in session.tool_calls]
    assert session.final_output is not None
    actions.append(final_action(session.final_output.text))
    expected = [i for a in actions for i in policy.encode_reply(a)]
    assert trained == expected
    # Everything else (system prompt, request, tool outputs) is context: the masked share is small.
    assert seq.policy_tokens == len(expected) < len(seq) / 2


def test_policy_turns_carry_recorded_ids_logprobs_and_advantages() -> None:
    call = LLMCall(
        call_id="l_a", prompt_token_ids=(1, 2), token_ids=(3, 4), logprobs=(-0.1, -0.2), policy_version=3
    )
    scripted = LLMCall(call_id="l_b", response="not ours")
    (turn,) = policy_turns(_session(call, scripted), {"l_a": 2.0})
    assert turn == Turn(prompt=(1, 2), completion=(3, 4), logprobs=(-0.1, -0.2), advantage=2.0)


def test_session_advantages_are_relative_to_each_group() -> None:
    # group g: rewards 3, 1 -> mean 2, population std 1 -> +1, -1; group h has one member -> 0.
    adv = session_advantages({"a": 3.0, "b": 1.0, "c": 7.0}, {"a": "g", "b": "g", "c": "h"})
    assert adv == pytest.approx({"a": 1.0, "b": -1.0, "c": 0.0}, abs=1e-5)


def test_call_advantages_add_the_step_reward_of_the_chosen_tool_call() -> None:
    session = _session(LLMCall(call_id="l_x1"), LLMCall(call_id="l_x2"))
    # the tool call c_x1 was chosen by l_x1 (same step id); l_x2 earned a reward itself
    adv = call_advantages(session, 1.0, {"c_x1": -2.0, "l_x2": 0.5}, step_coef=0.5)
    assert adv == {"l_x1": 1.0 + 0.5 * -2.0, "l_x2": 1.0 + 0.5 * 0.5}


def test_lag_counts_versions_behind_the_oldest_call() -> None:
    session = _session(LLMCall(call_id="l_1", policy_version=4), LLMCall(call_id="l_2", policy_version=5))
    assert lag(session, 7) == 3
    assert lag(_session(), 7) == 0


@given(st.lists(st.integers(1, 300), max_size=60), st.integers(16, 1200))
def test_packing_respects_the_budget_and_keeps_every_sequence_once(lengths: list[int], budget: int) -> None:
    batches = pack(lengths, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        padded = len(batch) * max(lengths[i] for i in batch)
        assert padded <= budget or len(batch) == 1


def test_padding_fraction_by_hand() -> None:
    lengths = [10, 6, 3, 1]
    # one micro-batch of four rows of 10: 20 real tokens in 40 slots
    assert padding_fraction(lengths, [[0, 1, 2, 3]]) == pytest.approx(0.5)
    # [10, 6] -> 16 of 20 slots, [3, 1] -> 4 of 6 slots: 1 - 20/26
    assert padding_fraction(lengths, [[0, 1], [2, 3]]) == pytest.approx(1 - 20 / 26)
    assert padding_fraction([], []) == 0.0


def test_budget_packing_pads_less_than_fixed_count_batches() -> None:
    lengths = [500, 40, 480, 60, 35, 510, 55, 45]
    budget = 1024
    assert padding_fraction(lengths, pack(lengths, budget)) < padding_fraction(lengths, fixed_batches(8, 2))


def test_collate_right_pads_and_packed_counts_tokens() -> None:
    sequences = merge_turns([Turn((1, 2), (3,), (-0.5,), 1.0)]) + merge_turns(
        [Turn((4,), (5, 6, 7), None, -1.0)]
    )
    micro = collate(sequences, pad_id=0)
    assert micro.input_ids.tolist() == [[1, 2, 3, 0], [4, 5, 6, 7]]
    assert micro.attention_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert micro.loss_mask.tolist() == [[False, False, True, False], [False, True, True, True]]
    assert torch.equal(micro.advantages[1], torch.tensor([0.0, -1.0, -1.0, -1.0]))
    batch = packed(sequences, budget=4, pad_id=0)
    assert (batch.tokens, batch.policy_tokens, len(batch.micro)) == (7, 4, 2)
    assert batch.padding == 0.0
