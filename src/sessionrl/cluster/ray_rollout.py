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
it was handed are handed to another; each replacement is logged (`logging`, this module's logger) with
the episodes handed out again. Episode session ids are deterministic, and the driver's `settle` skips an
episode whose session already holds its verdict and gives an episode cut off midway a fresh id, so no
episode is lost and none is counted twice. Before they are handed out again, the cut-off sessions are
closed as abandoned (`abandon`): `rejected`, with the reason, tagged `abandoned`, and their metadata
naming the dead worker; no reward or trainer reads a session without a verdict.
"""

from __future__ import annotations

import asyncio
import copy
import logging
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
from sessionrl.episodes.verdict import task_success
from sessionrl.errors import NotFound, SessionRLError
from sessionrl.policy.llm import HFPolicy
from sessionrl.policy.tiny import default_placement
from sessionrl.session.events import Event, SessionPatched, StateChanged
from sessionrl.session.lifecycle import ACTIVE
from sessionrl.session.model import SessionPatch, SessionState
from sessionrl.store import SessionStore
from sessionrl.store.writes import Unit
from sessionrl.train.config import RaySection, RunConfig

log = logging.getLogger(__name__)

ABANDONED = "abandoned"
"""The tag (and metadata key) of a session whose episode was cut off by its worker's death."""

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
        self.abandoned: list[str] = []
        """Sessions closed as abandoned because their worker died, over this object's life."""
        self.names: list[str] = []
        """Each slot's worker's actor name."""
        self.published: Published | None = None
        self.workers = [self._start(slot) for slot in range(self.settings.workers)]

    def _start(self, slot: int) -> Any:
        self._generation += 1
        actor = ray.remote(num_cpus=self.settings.cpus_per_worker, max_restarts=0)(RolloutWorker)
        name = f"{ACTOR_PREFIX}-{slot}.{self._generation}"
        if slot < len(self.names):
            self.names[slot] = name
        else:
            self.names.append(name)
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
                dead = self.names[slot]
                self._replace(slot, replaced_before)
                self._abandon(requests[request], dead)
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

    def _abandon(self, specs: Sequence[EpisodeSpec], dead: str) -> None:
        """Close the dead worker's cut-off sessions as abandoned and log the replacement."""
        reason = f"rollout worker {dead} died"
        with SessionStore.open(self.config.store_url) as store:
            closed = [sid for spec in specs for sid in abandon(store, spec, reason)]
        self.abandoned.extend(closed)
        log.warning(
            "%s; replaced by %s; %d episode(s) handed out again; sessions abandoned: %s",
            reason,
            ", ".join(n for n in self.names if n.startswith(dead.rsplit(".", 1)[0] + ".")),
            len(specs),
            ", ".join(closed) or "none",
        )

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


def abandon(store: SessionStore, spec: EpisodeSpec, reason: str) -> list[str]:
    """Close every attempt of `spec`'s episode that has no verdict and is not yet abandoned (`<id>`,
    `<id>.1`, ... as `settle` names them): tag it, note `reason` in its metadata, and reject it if it is
    still active, all in one unit. Returns the ids closed. Call only once nothing writes them any more."""
    first = spec.session_id
    if first is None:
        return []
    closed = []
    for attempt in range(1000):
        sid = f"{first}.{attempt}" if attempt else first
        try:
            session = store.get(sid)
        except NotFound:
            break
        if task_success(session) is not None or ABANDONED in session.tags:
            continue
        patch = SessionPatch(
            tags=(*session.tags, ABANDONED), metadata={**session.metadata, ABANDONED: reason}
        )
        events: list[Event] = [SessionPatched(patch=patch)]
        if session.state in ACTIVE:
            events.append(StateChanged(state=SessionState.REJECTED, reason=f"{ABANDONED}: {reason}"))
        version = session.state_version
        writes = [(sid, event, version + i) for i, event in enumerate(events)]
        [results] = store.append_units([Unit(writes)])
        if not isinstance(results[0], SessionRLError):
            closed.append(sid)
    return closed


__all__ = ["ABANDONED", "ACTOR_PREFIX", "Published", "RayRollout", "RolloutWorker", "StaleWeights", "abandon"]
