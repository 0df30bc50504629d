"""Sessions to token sequences: loss masks, merging, advantages, staleness, packing and padding."""

from __future__ import annotations

from datetime import timedelta
from itertools import groupby

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny_orders import SHORT_PROMPTS, OrdersWorld

from sessionrl.orchestrator.policy import parse_tool_call
from sessionrl.policy.llm import parse_final
from sessionrl.policy.references import Context, resolve
from sessionrl.session.model import CallStatus, LLMCall, Message, Session, ToolCall, utcnow
from sessionrl.train.llm.data import (
    Turn,
    call_advantages,
    call_message,
    collate,
    demonstration_turns,
    fixed_batches,
    lag,
    merge_turns,
    pack,
    pack_end_to_end,
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


def test_demonstration_masks_cover_the_expert_actions_which_resolve_to_the_recorded_calls(
    orders_world: OrdersWorld,
) -> None:
    policy = orders_world.policy()
    session = next(s for s in orders_world.experts if len(s.tool_calls) >= 3)
    turns = demonstration_turns(session, orders_world.system, policy, SHORT_PROMPTS.max_tool_chars)
    (seq,) = merge_turns(turns, session.session_id)  # the turns nest: one sequence per session
    runs = [
        list(g) for m, g in groupby(zip(seq.input_ids, seq.loss_mask, strict=True), key=lambda x: x[1]) if m
    ]
    actions = [policy.tokenizer.decode([t for t, _ in run][:-1]) for run in runs]  # last id: the stop token
    assert len(actions) == len(session.tool_calls) + 1
    assert all(run[-1][0] == policy.tokenizer.eos_token_id for run in runs)
    # replayed against the conversation, every action does exactly what the expert did
    messages = [
        Message(role="system", content=orders_world.system),
        Message(role="user", content=session.user_query),
    ]
    for call, text in zip(session.tool_calls, actions, strict=False):
        choice = parse_tool_call(text)
        assert choice is not None
        assert choice.tool == call.tool
        assert resolve(choice.params, Context.from_messages(messages)) == call.params
        messages += [Message(role="assistant", content=text), call_message(call, 200)]
    final = parse_final(actions[-1])
    assert final is not None
    assert session.final_output is not None
    assert resolve(final, Context.from_messages(messages)) == session.final_output.text
    assert "{{user." in actions[0]  # ids from the request are referenced, not retyped
    assert seq.policy_tokens < len(seq) / 2  # the rest (system prompt, request, tool outputs) is context


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


def test_call_advantages_add_the_step_rewards_of_the_tool_calls_each_policy_call_led_to() -> None:
    t0 = utcnow()
    first = LLMCall(call_id="l_1", started_at=t0)
    second = LLMCall(call_id="l_2", started_at=t0 + timedelta(seconds=2))
    tool = ToolCall(call_id="c_9", tool="x", status=CallStatus.ERROR, started_at=t0 + timedelta(seconds=1))
    session = _session(first, second).model_copy(update={"tool_calls": (tool,)})
    adv = call_advantages(session, 1.0, {"c_9": -2.0, "l_2": 0.5}, step_coef=0.5)
    assert adv == {"l_1": 1.0 + 0.5 * -2.0, "l_2": 1.0 + 0.5 * 0.5}


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
    batch = packed(sequences, budget=4)
    assert (batch.tokens, batch.policy_tokens, len(batch.micro)) == (7, 4, 2)
    assert batch.computed == 7  # packed rows: every computed slot is a token


def test_packed_rows_lay_sequences_end_to_end_with_restarting_positions() -> None:
    sequences = merge_turns([Turn((1, 2), (3,), (-0.5,), 1.0)]) + merge_turns(
        [Turn((4,), (5, 6, 7), None, -1.0)]
    )
    (micro,) = packed(sequences, budget=16, share_prefixes=False).micro
    assert micro.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7]]  # index order inside a micro-batch
    assert micro.position_ids is not None
    assert micro.segments is not None
    assert micro.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3]]
    assert micro.segments.tolist() == [0, 3, 7]
    assert micro.loss_mask.tolist() == [[False, False, True, False, True, True, True]]
    assert micro.advantages.tolist() == [[0.0, 0.0, 1.0, 0.0, -1.0, -1.0, -1.0]]
    # a budget smaller than both: one micro-batch each, longest first
    assert [m.input_ids.shape[1] for m in packed(sequences, budget=4, share_prefixes=False).micro] == [4, 3]
    # sharing prefixes (none here), the sequences go in the order of what they may share: (), then (1,)
    (micro,) = packed(sequences, budget=16).micro
    assert micro.input_ids.tolist() == [[4, 5, 6, 7, 1, 2, 3]]
    assert micro.parents is not None
    assert micro.parents.tolist() == [-1, -1]


def test_end_to_end_packing_fills_each_micro_batch_up_to_the_budget() -> None:
    lengths = [500, 40, 480, 60, 35, 510, 55, 45]
    groups = pack_end_to_end(lengths, 1024)
    assert sorted(i for g in groups for i in g) == list(range(8))
    assert all(sum(lengths[i] for i in g) <= 1024 for g in groups)
    assert len(groups) == 2  # 1725 tokens need two micro-batches of 1024


def test_an_empty_shard_packs_to_an_empty_batch() -> None:
    batch = packed([], budget=64)
    assert (batch.micro, batch.policy_tokens, batch.tokens, batch.computed) == ((), 0, 0, 0)
