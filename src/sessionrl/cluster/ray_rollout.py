"""RL episodes on Ray actors: each worker holds the run's environment, a policy replica and a store
client, and runs the episodes it is handed through the one episode driver (`run_episodes`).

    trainer ──ray.put──▶ (model, tokenizer) once ──▶ each worker builds its replica
    trainer ──ray.put──▶ weights tagged with their policy version ──▶ a worker loads them when its
        replica's version differs, and its sessions record the version that acted
    worker  ──▶ the shared store (the run's store URL: PostgreSQL across machines, or one SQLite file
        on one machine) ──▶ the trainer reads scored sessions from the change feed, as in-process

Staleness: weights are published every `publish_every` policy versions, and a rollout never starts with
weights more than `rl.max_lag` versions behind the trainer (the feed drops staler sessions anyway).

A worker that dies (its process killed, its machine gone) is replaced by a fresh actor and the episodes
it was handed are handed to another. Episode session ids are deterministic, and the driver's `settle`
skips an episode whose session already holds its verdict and gives an episode cut off midway a fresh id,
so no episode is lost and none is counted twice; the cut-off session stays open without a verdict, and
no reward or trainer ever reads it.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import ray
from ray.exceptions import RayActorError

from sessionrl.envs.base import stream_seed
from sessionrl.episodes import EpisodeSpec, Ran, run_episodes
from sessionrl.episodes.llm import PolicyAgent
from sessionrl.policy.llm import HFPolicy
from sessionrl.policy.tiny import default_placement
from sessionrl.store import SessionStore
from sessionrl.train.config import RaySection, RunConfig

ACTOR_PREFIX = "sessionrl-rollout"
"""Workers are named `<prefix>-<slot>.<generation>`: a replacement takes its slot under a new generation."""


class StaleWeights(RuntimeError):
    """A rollout would act with weights older than the staleness bound allows."""


@dataclass(frozen=True, slots=True)
class Published:
    """Policy weights in Ray's object store (a reference to a CPU state dict) and their policy version."""

    version: int
    weights: Any


class RolloutWorker:
    """The state of one Ray actor: environment, store client and policy replica."""

    def __init__(self, config: RunConfig, replica: tuple[Any, Any], slot: int, generation: int) -> None:
        model, tokenizer = replica
        device, _ = default_placement()
        self.config = config
        self.policy = HFPolicy(model.to(device), tokenizer, config.rl.sampling, config.batching, version=-1)
        self.policy.generator.manual_seed(stream_seed(config.seed, "rollout-worker", slot, generation))
        self.env = config.env.build()
        self.store = SessionStore.open(config.store_url)

    def run(self, specs: Sequence[EpisodeSpec], published: Published) -> list[Ran]:
        """Run `specs` with the published weights (loaded first when this replica holds others)."""
        if published.version != self.policy.version:
            self.policy.model.load_state_dict(ray.get(published.weights))
            self.policy.version = published.version
        cfg = self.config
        agent = PolicyAgent(self.policy, published.version)
        batch = run_episodes(self.env, specs, agent, self.store, cfg.rollout, orchestrator=cfg.orchestrator)
        return asyncio.run(batch)

    def version(self) -> int:
        """The policy version this replica holds (-1 before its first weights)."""
        return self.policy.version


class RayRollout:
    """Workers on Ray actors running a run's RL episodes (see the module doc); a context manager that
    joins (or starts) Ray and stops its workers on exit."""

    def __init__(self, config: RunConfig, policy: HFPolicy) -> None:
        if config.cluster.ray is None:
            raise ValueError("RayRollout needs a `cluster: {ray: ...}` section")
        self.config = config
        self.settings: RaySection = config.cluster.ray
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(address=self.settings.address, include_dashboard=False, log_to_driver=False)
        model = copy.deepcopy(policy.model).to("cpu")
        self._replica = ray.put((model, policy.tokenizer))
        self._generation = 0
        self.replaced = 0
        """Workers replaced after they died, over this object's life."""
        self.published: Published | None = None
        self.workers = [self._start(slot) for slot in range(self.settings.workers)]

    def _start(self, slot: int) -> Any:
        self._generation += 1
        actor = ray.remote(num_cpus=self.settings.cpus_per_worker, max_restarts=0)(RolloutWorker)
        name = f"{ACTOR_PREFIX}-{slot}.{self._generation}"
        return actor.options(name=name).remote(self.config, self._replica, slot, self._generation)

    def publish(self, policy: HFPolicy) -> Published:
        """Put the policy's weights (on the CPU) in the object store, tagged with its version."""
        weights = {k: v.detach().to("cpu") for k, v in policy.model.state_dict().items()}
        self.published = Published(policy.version, ray.put(weights))
        return self.published

    def weights_for(self, policy: HFPolicy) -> Published:
        """The weights a rollout at `policy.version` acts with: those published, unless `publish_every`
        versions have passed since; never more than `rl.max_lag` versions behind."""
        published = self.published
        if published is None or policy.version - published.version >= self.settings.publish_every:
            published = self.publish(policy)
        if policy.version - published.version > self.config.rl.max_lag:
            raise StaleWeights(
                f"weights of version {published.version} are more than rl.max_lag={self.config.rl.max_lag}"
                f" versions behind the trainer's {policy.version}"
            )
        return published

    def run(self, specs: Sequence[EpisodeSpec], policy: HFPolicy) -> list[Ran]:
        """Run `specs` on the workers, `episodes_per_request` at a time; one `Ran` per spec, in order.

        Episodes handed to a worker that died are handed out again, to its replacement or another."""
        published = self.weights_for(policy)
        size = self.settings.episodes_per_request
        requests = [list(specs[i : i + size]) for i in range(0, len(specs), size)]
        queue, idle = deque(range(len(requests))), list(range(len(self.workers)))
        running: dict[Any, tuple[int, int]] = {}
        done: dict[int, list[Ran]] = {}
        replaced_before = self.replaced
        while queue or running:
            while queue and idle:
                slot, request = idle.pop(), queue.popleft()
                running[self.workers[slot].run.remote(requests[request], published)] = (slot, request)
            [ready], _ = ray.wait(list(running), num_returns=1)
            slot, request = running.pop(ready)
            try:
                done[request] = ray.get(ready)
            except RayActorError:
                self._replace(slot, replaced_before)
                queue.appendleft(request)
            idle.append(slot)
        return [ran for request in range(len(requests)) for ran in done[request]]

    def _replace(self, slot: int, replaced_before: int) -> None:
        """A fresh worker in `slot` (the dead one killed for certain first)."""
        if self.replaced - replaced_before >= self.settings.max_replacements:
            raise RuntimeError(
                f"more than {self.settings.max_replacements} rollout workers died in one rollout"
            )
        ray.kill(self.workers[slot], no_restart=True)
        self.workers[slot] = self._start(slot)
        self.replaced += 1

    def close(self) -> None:
        """Stop the workers, and Ray itself when this object started it."""
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        self.workers = []
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


__all__ = ["ACTOR_PREFIX", "Published", "RayRollout", "RolloutWorker", "StaleWeights"]
