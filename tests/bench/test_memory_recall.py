"""Two-turn orders conversations: the follow-up hides the order, and the same agent resolves it with
memory and fails it without, which entity recall (ER@5), forgetting (L4) and the memory reward show."""

from __future__ import annotations

import pytest

from research.memory import MEMORY_SKILLS, MemoryStore, memory_skills
from research.memory.agent import RecallingAgent, run_conversations
from research.memory.reward import memory_recall
from sessionrl.envs.base import Split
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.envs.orders.followups import Conversation, customer
from sessionrl.eval.levels import Level, assess
from sessionrl.eval.metrics import compute
from sessionrl.rewards import check_reward_term
from sessionrl.rewards.checker import default_context
from sessionrl.store import SessionStore


def env_with_memory() -> OrdersEnv:
    return OrdersEnv(
        DomainConfig(train=1, dev=1, test=1, time_factor=0),
        shared_skills=memory_skills(MemoryStore(encoder="hash")),
    )


def test_follow_ups_hide_what_the_first_turn_said() -> None:
    env = env_with_memory()
    for first, second in env.conversations(Split.TEST, 4):
        conversation = Conversation.of(second)
        assert conversation is not None
        assert conversation.first == first.task_id
        assert conversation.remembered  # the order at least
        assert all(e in first.instruction and e not in second.instruction for e in conversation.remembered)
        assert customer(first) == customer(second)
        assert set(conversation.remembered) <= set(env.expected_entities(second))
        # the follow-up's expert, who knows the order, solves it: the world is consistent
        assert len(env.expert(second).steps) >= 4
    assert {c.name for c in env.contracts()} >= set(MEMORY_SKILLS)
    episode = env.episode(env.conversations(Split.TEST, 1)[0][1])
    assert {s.name for s in episode.skills()} >= set(MEMORY_SKILLS)


def test_memory_beats_no_memory_on_entity_recall() -> None:
    results = {}
    for use_memory in (True, False):
        env = env_with_memory()
        pairs = env.conversations(Split.TEST, 4)
        with SessionStore.open("sqlite:///:memory:") as store:
            agent = RecallingAgent(env, customer, use_memory=use_memory)
            first, second = run_conversations(env, pairs, agent, store)
            follow_ups = [store.get(r.session_id) for r in second]
        assert all(r.success for r in first)  # the first turn names everything: memory is not needed
        results[use_memory] = (compute(follow_ups), assess(follow_ups)[Level.L4], [r.success for r in second])
        rewards = [memory_recall(s, default_context()) for s in follow_ups]
        for s in follow_ups:
            check_reward_term(memory_recall, [s])
        # the memory layer's reward: fresh memories (written seconds ago) recalled in full earn ~1
        assert all(r.value == pytest.approx(1.0 if use_memory else 0.0, abs=1e-3) for r in rewards)
        tools = {c.tool for s in follow_ups for c in s.tool_calls}
        assert ("memory_search" in tools) is use_memory  # memory use is recorded in the sessions
    with_memory, without = results[True], results[False]
    assert with_memory[0].er5 == 1.0
    assert without[0].er5 is not None
    assert without[0].er5 < with_memory[0].er5
    assert (with_memory[1].value, with_memory[1].passed) == (0.0, True)  # nothing forgotten
    assert (without[1].value, without[1].passed) == (1.0, False)
    assert all(with_memory[2])
    assert not any(without[2])
