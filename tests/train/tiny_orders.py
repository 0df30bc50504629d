"""A small orders world for the training tests: expert sessions in a store and a tiny policy (built once)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sessionrl.envs.base import Split
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.episodes import EpisodeSpec, RolloutConfig, expert, run_episodes
from sessionrl.episodes.llm import prompt_messages
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.session.model import Session
from sessionrl.store import SessionStore
from sessionrl.train.llm.run import tokenizer_corpus

SMALL_MODEL = TinyModelConfig(vocab_size=600, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
SHORT_PROMPTS = RolloutConfig(full_schemas=False, domain_policy=False, max_tool_chars=200, max_steps=3)


@dataclass(frozen=True)
class OrdersWorld:
    """An orders environment, a store of expert sessions, and a tiny policy whose tokenizer knows them."""

    env: OrdersEnv
    store: SessionStore
    experts: tuple[Session, ...]
    system: str
    model_dir: Path

    def policy(self, sampling: SamplingConfig | None = None) -> HFPolicy:
        """A fresh copy of the tiny policy (weights as built), sampling as asked (12 new tokens at most)."""
        return HFPolicy.load(self.model_dir, sampling or SamplingConfig(max_new_tokens=12))


def build_orders_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OrdersWorld]:
    """Twelve expert sessions of a small orders environment, and a tiny policy whose tokenizer knows them."""
    env = OrdersEnv(DomainConfig(train=24, dev=6, test=12))
    store = SessionStore.open("sqlite://")
    tasks = env.tasks(Split.TRAIN)[:12]
    specs = [EpisodeSpec(task, f"demo-{task.task_id}", metadata={"stage": "demo"}) for task in tasks]
    ran = asyncio.run(run_episodes(env, specs, expert(env), store, SHORT_PROMPTS))
    experts = tuple(store.get(r.session_id) for r in ran)
    system = prompt_messages(env, tasks[0], SHORT_PROMPTS)[0].content
    folder = tmp_path_factory.mktemp("tiny-orders")
    build_tiny_policy(
        tokenizer_corpus(env, system, experts, SHORT_PROMPTS.max_tool_chars), SMALL_MODEL, folder
    )
    yield OrdersWorld(env, store, experts, system, folder)
    store.close()
