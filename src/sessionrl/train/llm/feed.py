"""The two readers of the change feed in a training run: the reward shaper and the trainer.

The shaper follows session changes and scores every finished session that has its `task_outcome`
verdict, storing a reward vector (a new reward version announces itself on the feed). The trainer
follows reward changes and takes the sessions of its stage that were sampled at most `max_lag` policy
versions ago; staler ones are left out and counted. Both keep a cursor, saved in checkpoints, so a
resumed run reads on from where it stopped (delivery is at-least-once; a session read twice is kept once).

Late feedback: a session whose metadata names a `verdict_due` iteration (`rl.late_share` marks some, as
annotators who judge later would) is held by the shaper until the loop reaches that iteration, then
scored; the trainer reads it then, a few policy versions after it was sampled, and ranks it against its
whole group (`GroupMemory`: the peers trained before it count in the baseline, and are not trained again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessionrl.episodes.verdict import task_success
from sessionrl.rewards.engine import RewardEngine
from sessionrl.session.model import Session, SessionState
from sessionrl.store import SessionStore
from sessionrl.train.llm.data import lag

REWARD_CHANGE = "reward"
"""Change-feed type of a saved reward version."""
SESSION_CHANGES = frozenset({"feedback", "state_changed"})
"""Change-feed types after which a session may have become ready to score."""
VERDICT_DUE = "verdict_due"
"""Session metadata: the RL iteration at which a late session's verdict reaches the reward shaper."""


def changed_sessions(store: SessionStore, after: int, types: frozenset[str]) -> tuple[int, list[str]]:
    """Session ids with a change of one of `types` after cursor `after` (each once, in feed order), and
    the cursor that follows them."""
    cursor, seen = after, dict[str, None]()
    while True:
        batch = store.changes(after=cursor, limit=1000)
        seen.update((c.session_id, None) for c in batch.changes if c.type in types)
        if batch.cursor == cursor:
            return cursor, list(seen)
        cursor = batch.cursor


class RewardShaper:
    """Scores finished, judged sessions as they appear on the feed (a late one once its verdict is due)."""

    def __init__(self, engine: RewardEngine, store: SessionStore) -> None:
        self.engine = engine
        self.store = store
        self.held: dict[str, int] = {}
        """Judged sessions whose verdict is not due yet: the iteration it reaches the shaper, by id."""

    def follow(self, after: int, now: int | None = None) -> tuple[int, int]:
        """Score what changed after cursor `after`, and the held sessions due by iteration `now`; return the
        next cursor and how many were scored. A session whose `verdict_due` lies past `now` is held (with
        `now` None, nothing is: outside the RL loop every verdict counts at once).

        They are scored in the order of their ids, not the feed's: each score reads the layer statistics
        the ones before it left, and the feed's order is the order in which concurrent episodes happened
        to commit, so a seeded run would not give the same rewards twice."""
        cursor, ids = changed_sessions(self.store, after, SESSION_CHANGES)
        due = [sid for sid, at in self.held.items() if now is None or at <= now]
        scored = 0
        for sid in sorted({*ids, *due}):
            session = self.store.get(sid)
            if session.state is not SessionState.FINISHED or task_success(session) is None:
                continue
            arrives = session.metadata.get(VERDICT_DUE)
            if now is not None and arrives is not None and int(arrives) > now:
                self.held[sid] = int(arrives)
                continue
            self.held.pop(sid, None)
            self.engine.score_and_store(self.store, sid)
            scored += 1
        self.engine.save_stats()
        return cursor, scored

    def recall(self, now: int) -> int:
        """After a resume: hold again every session whose verdict is due after iteration `now` - 1 and that
        has no reward yet (the cursor saved in the checkpoint lies past them); how many."""
        _, ids = changed_sessions(self.store, 0, SESSION_CHANGES)
        for sid in ids:
            arrives = self.store.get(sid).metadata.get(VERDICT_DUE)
            if arrives is not None and int(arrives) >= now and not self.store.rewards(sid):
                self.held[sid] = int(arrives)
        return len(self.held)


@dataclass(frozen=True, slots=True)
class Scored:
    """A session and its latest reward vector (as stored: a JSON mapping)."""

    session: Session
    vector: dict[str, Any]

    def reward(self, key: str) -> float:
        """One reward of the vector: `session` or `long_term` (weighted and normalised totals), or the raw
        value of one layer (`layer:<name>`) or one term (`term:<name>`; 0 when the term did not fire)."""
        kind, _, name = key.partition(":")
        if kind == "layer":
            return float(self.vector["layers"][name]["raw"])
        if kind == "term":
            return sum(float(t["value"]) for t in self.vector["terms"] if t["name"] == name)
        return float(self.vector[f"{key}_reward"])

    @property
    def step_rewards(self) -> dict[str, float]:
        """Per-step rewards keyed by call id."""
        return {k: float(v) for k, v in self.vector.get("step_rewards", {}).items()}


@dataclass
class GroupMemory:
    """Rewards of the sessions trained lately, by GRPO group, so that a session scored late is ranked
    against its whole group: the peers trained before it count in its baseline."""

    rewards: dict[str, dict[str, float]] = field(default_factory=dict)
    """Group label -> session id -> reward."""
    iteration: dict[str, int] = field(default_factory=dict)
    """Group label -> the iteration its sessions were sampled in."""

    def ranked(
        self, rewards: Mapping[str, float], groups: Mapping[str, str]
    ) -> tuple[dict[str, float], dict[str, str]]:
        """`rewards` and `groups` with the remembered peers of their groups added (to rank against only;
        the caller trains on its own ids).

        >>> memory = GroupMemory({"g": {"a": 1.0}}, {"g": 0})
        >>> memory.ranked({"b": 0.0}, {"b": "g"})
        ({'a': 1.0, 'b': 0.0}, {'a': 'g', 'b': 'g'})
        """
        peers = {sid: (g, r) for g in set(groups.values()) for sid, r in self.rewards.get(g, {}).items()}
        peers = {sid: v for sid, v in peers.items() if sid not in rewards}
        return (
            {**{sid: r for sid, (_, r) in peers.items()}, **rewards},
            {**{sid: g for sid, (g, _) in peers.items()}, **groups},
        )

    def remember(self, scored: Sequence[Scored], reward: str, oldest: int) -> None:
        """Keep the rewards of `scored` (by `reward`), and forget groups sampled before iteration `oldest`."""
        for s in scored:
            group = str(s.session.metadata["group"])
            self.rewards.setdefault(group, {})[s.session.session_id] = s.reward(reward)
            self.iteration[group] = int(s.session.metadata.get("iteration", oldest))
        for group in [g for g, at in self.iteration.items() if at < oldest]:
            del self.rewards[group], self.iteration[group]


class StaleFeed(RuntimeError):
    """Every scored session the trainer read was sampled too many policy versions ago."""


@dataclass(frozen=True, slots=True)
class FeedRead:
    """What the trainer took from the feed: fresh scored sessions, how many stale ones it left, the cursor."""

    fresh: tuple[Scored, ...]
    stale: int
    cursor: int

    def stale_note(self, max_lag: int) -> str | None:
        """What to tell the console of the sessions left out for staleness; None when there were none.

        >>> FeedRead((), 3, 0).stale_note(2)
        'dropped 3 of 3 scored sessions: sampled more than rl.max_lag=2 policy versions ago'
        """
        if not self.stale:
            return None
        read = self.stale + len(self.fresh)
        return (
            f"dropped {self.stale} of {read} scored sessions: sampled more than rl.max_lag={max_lag}"
            " policy versions ago"
        )

    def require_fresh(self, max_lag: int) -> None:
        """Raise `StaleFeed` when stale sessions came and no fresh one did: the trainer would learn nothing
        while rollouts went on sampling too old a policy."""
        if self.stale and not self.fresh:
            raise StaleFeed(
                f"{self.stale_note(max_lag)}, and none was fresh: rollouts lag the trainer; raise rl.max_lag "
                "or publish weights to the rollouts more often"
            )


def read_scored(store: SessionStore, after: int, *, stage: str, version: int, max_lag: int) -> FeedRead:
    """Sessions of `stage` scored after cursor `after`, split by staleness against policy `version`."""
    cursor, ids = changed_sessions(store, after, frozenset({REWARD_CHANGE}))
    fresh: list[Scored] = []
    stale = 0
    for sid in ids:
        session = store.get(sid)
        if session.metadata.get("stage") != stage:
            continue
        if lag(session, version) > max_lag:
            stale += 1
            continue
        fresh.append(Scored(session, store.reward(sid).vector))
    return FeedRead(tuple(fresh), stale, cursor)


__all__ = [
    "VERDICT_DUE",
    "FeedRead",
    "GroupMemory",
    "RewardShaper",
    "Scored",
    "StaleFeed",
    "changed_sessions",
    "read_scored",
]
