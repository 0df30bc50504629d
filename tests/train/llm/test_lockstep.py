"""Lockstep rounds: each holds the next call of every running episode, in the order of their text (then of
their sessions' ids), however the episodes' timing falls."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from sessionrl.orchestrator.policy import PolicyError, PolicyReply
from sessionrl.session.model import Message
from sessionrl.train.llm.lockstep import Lockstep, seat


class Recorder:
    """Stands in for the policy: answers each conversation with its last message, and keeps every round."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.rounds: list[list[str]] = []
        self.fail_at = fail_at

    def generate_now(self, conversations: Sequence[Sequence[Message]]) -> list[PolicyReply]:
        self.rounds.append([c[-1].content for c in conversations])
        if self.fail_at == len(self.rounds):
            raise RuntimeError("model fell over")
        return [PolicyReply(text=c[-1].content) for c in conversations]


async def episode(lockstep: Lockstep, name: str, calls: int, rng: random.Random) -> list[str]:
    """An episode that asks `calls` times, taking a random while between calls (its tool steps)."""
    answers = []
    try:
        for turn in range(calls):
            await asyncio.sleep(rng.random() / 200)
            reply = await lockstep.generate([Message(role="user", content=f"{name}{turn}")], purpose="act")
            answers.append(reply.text)
    finally:
        lockstep.leave()
    return answers


def run_rounds(timing_seed: int, policy: Any) -> tuple[list[list[str]], list[list[str]]]:
    async def main() -> list[list[str]]:
        lockstep = Lockstep(policy, episodes=3)
        rng = random.Random(timing_seed)
        calls = {"c": 3, "a": 1, "b": 2}
        return list(await asyncio.gather(*(episode(lockstep, n, k, rng) for n, k in calls.items())))

    answers = asyncio.run(main())
    return answers, policy.rounds


def test_a_round_waits_for_every_running_episode_and_sorts_them_whatever_the_timing() -> None:
    outcomes = [run_rounds(seed, Recorder()) for seed in range(4)]
    answers, rounds = outcomes[0]
    assert answers == [["c0", "c1", "c2"], ["a0"], ["b0", "b1"]]
    assert rounds == [["a0", "b0", "c0"], ["b1", "c1"], ["c2"]]
    assert all(outcome == outcomes[0] for outcome in outcomes)


def test_a_failed_round_fails_each_of_its_calls_with_the_reason() -> None:
    async def main() -> list[BaseException | list[str]]:
        policy: Any = Recorder(fail_at=1)
        lockstep = Lockstep(policy, episodes=2)
        rng = random.Random(0)
        runs = (episode(lockstep, n, 1, rng) for n in "ab")
        return list(await asyncio.gather(*runs, return_exceptions=True))

    results = asyncio.run(main())
    assert all(isinstance(r, PolicyError) and "fell over" in str(r) for r in results)


class Rows:
    """Stands in for the policy: answers each row of a round with its place in the round (its draw)."""

    def generate_now(self, conversations: Sequence[Sequence[Message]]) -> list[PolicyReply]:
        return [PolicyReply(text=str(row)) for row in range(len(conversations))]


def twins(first: str) -> dict[str, str]:
    """Two episodes asking the same conversation, `first` asking first: what each session was answered."""

    async def ask(lockstep: Lockstep, session: str, wait: float) -> tuple[str, str]:
        with seat(session):
            await asyncio.sleep(wait)
            try:
                reply = await lockstep.generate([Message(role="user", content="same")], purpose="act")
            finally:
                lockstep.leave()
        return session, reply.text

    async def main() -> dict[str, str]:
        policy: Any = Rows()
        lockstep = Lockstep(policy, episodes=2)
        asked = [ask(lockstep, s, 0.0 if s == first else 0.01) for s in ("rl-b", "rl-a")]
        return dict(await asyncio.gather(*asked))

    return asyncio.run(main())


def test_identical_conversations_draw_in_the_order_of_their_sessions_whoever_asks_first() -> None:
    assert twins(first="rl-b") == twins(first="rl-a") == {"rl-a": "0", "rl-b": "1"}
