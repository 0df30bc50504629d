"""The two readers of the change feed in a training run: the reward shaper and the trainer.

The shaper follows session changes and scores every finished session that has its `task_outcome`
verdict, storing a reward vector (a new reward version announces itself on the feed). The trainer
follows reward changes and takes the sessions of its stage that were sampled at most `max_lag` policy
versions ago; staler ones are left out and counted. Both keep a cursor, saved in checkpoints, so a
resumed run reads on from where it stopped (delivery is at-least-once; a session read twice is kept once).
"""

from __future__ import annotations

from dataclasses import dataclass
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
    """Scores finished, judged sessions as they appear on the feed."""

    def __init__(self, engine: RewardEngine, store: SessionStore) -> None:
        self.engine = engine
        self.store = store

    def follow(self, after: int) -> tuple[int, int]:
        """Score what changed after cursor `after`; return the next cursor and how many were scored."""
        cursor, ids = changed_sessions(self.store, after, SESSION_CHANGES)
        scored = 0
        for sid in ids:
            session = self.store.get(sid)
            if session.state is SessionState.FINISHED and task_success(session) is not None:
                self.engine.score_and_store(self.store, sid)
                scored += 1
        self.engine.save_stats()
        return cursor, scored


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


__all__ = ["FeedRead", "RewardShaper", "Scored", "StaleFeed", "changed_sessions", "read_scored"]
