"""The reward engine: rules → discount → judge refinement → layers → a stored, versioned reward vector.

Each `score` call looks at the rule file first (hot reload), runs every term of the rule-set in force,
assembles the vector with the layer statistics of that rule-set, and then (unless told not to) folds the
session into those statistics and into the best known step counts.

Storing is idempotent per (rule-set version, session version): scoring an unchanged session again under
the same rules returns the stored version instead of writing a new one. New feedback raises the session's
version, so it gets a new reward version; older versions stay readable in the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from sessionrl.rewards.catalog import UserTerms, term_catalog
from sessionrl.rewards.judge.base import Judge
from sessionrl.rewards.judge.runner import JudgeConfig, JudgeRunner
from sessionrl.rewards.rules import RuleFileError, RuleSet
from sessionrl.rewards.source import RuleSource
from sessionrl.rewards.stats import StatsBook
from sessionrl.rewards.terms import (
    BUILTIN_TERMS,
    Params,
    RatingPredictor,
    ScoringContext,
    Term,
    TermResult,
    scenario_key,
    succeeded,
)
from sessionrl.rewards.vector import RewardVector, assemble
from sessionrl.session.lifecycle import TERMINAL
from sessionrl.session.model import Session, utcnow
from sessionrl.skills.contract import load_contracts
from sessionrl.store import SessionStore
from sessionrl.store.documents import iso


class RewardConfig(BaseModel):
    """How sessions are rewarded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: Path | None = Field(default=None, description="Rule file (YAML); the shipped rules when unset.")
    stats_path: Path | None = Field(default=None, description="JSON file of layer stats; memory when unset.")
    contracts: Path | None = Field(
        default=None, description="Folder of skill contracts; their SLA p95_ms are latency budgets."
    )
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="How comments are judged.")
    learn: bool = Field(default=True, description="Update layer stats and best step counts when scoring.")


@dataclass(frozen=True)
class StoredReward:
    """The reward version a session has after storing, and whether this call wrote it."""

    session_id: str
    version: int
    new: bool


class RewardEngine:
    """Scores sessions into reward vectors and stores them as new reward versions.

    `terms` are Python terms of your own, next to the built-ins, that the rule file switches on by name
    under `terms:` (see `sessionrl.rewards.catalog`). Each is checked with `check_reward_term` here, and
    the rule file must switch every one of them on.
    """

    def __init__(
        self,
        config: RewardConfig | None = None,
        *,
        terms: UserTerms | None = None,
        judge: Judge | None = None,
        rating_model: RatingPredictor | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.config = config or RewardConfig()
        catalog = term_catalog(terms)
        self.source = RuleSource(self.config.rules, catalog)
        _require_switched_on(self.source, set(catalog) - set(BUILTIN_TERMS))
        self.judge = (
            JudgeRunner(judge, cache_size=self.config.judge.cache_size)
            if judge is not None
            else JudgeRunner.from_config(self.config.judge)
        )
        self.rating_model = rating_model
        self.clock = clock
        self.stats = StatsBook(self.config.stats_path)
        self.budgets = contract_budgets(self.config.contracts) if self.config.contracts else {}
        self._merged: dict[str, Params] = {}

    @property
    def ruleset(self) -> RuleSet:
        """The rule-set in force now (the file is checked for edits)."""
        return self.source.current()

    def context(self, ruleset: RuleSet) -> ScoringContext:
        """A fresh scoring context under `ruleset`."""
        return ScoringContext(
            now=self.clock(),
            params=self._params(ruleset),
            best_steps=dict(self.stats.get(ruleset.version).best_steps),
            penalties=ruleset.penalties,
            judge=self.judge,
            rating_model=self.rating_model,
        )

    def _params(self, ruleset: RuleSet) -> Params:
        """The rule file's settings, with contract budgets for tools the file gives no budget."""
        if not self.budgets:
            return ruleset.file
        cached = self._merged.get(ruleset.version)
        if cached is None:
            budgets = self.budgets | ruleset.file.latency_budget_ms
            cached = self._merged[ruleset.version] = ruleset.file.model_copy(
                update={"latency_budget_ms": budgets}
            )
        return cached

    def score(self, session: Session, *, learn: bool = True) -> RewardVector:
        """The reward vector of a session under the rules in force.

        The session is folded into the layer statistics and best step counts when both `learn` and
        `config.learn` are true (storing passes `learn=False` for sessions it scored before, so a session
        re-scored after late feedback is not counted twice).
        """
        ruleset = self.source.current()
        ctx = self.context(ruleset)
        results: list[tuple[Term, TermResult]] = [(t, t.fn(session, ctx)) for t in ruleset.terms]
        learned = self.stats.get(ruleset.version)
        vector = assemble(session, ruleset, results, learned.layers, ctx.now)
        if learn and self.config.learn:
            for name, layer in vector.layers.items():
                learned.observe_layer(name, layer.raw)
            if succeeded(session):
                learned.observe_steps(scenario_key(session), len(session.tool_calls))
        return vector

    def score_and_store(self, store: SessionStore, session_id: str) -> StoredReward:
        """Score a stored session and save the vector as a new reward version.

        When the latest stored version was made under the same rules from the same session version, that
        version is returned (`new=False`) and nothing is written.
        """
        session = store.get(session_id)
        history = store.rewards(session_id)
        if history:
            last = history[-1]
            if (last.ruleset_version, last.session_version) == (self.ruleset.version, session.state_version):
                return StoredReward(session_id, last.version, new=False)
        vector = self.score(session, learn=not history)
        version = store.save_reward(session_id, vector.model_dump(mode="json"), vector.ruleset_version)
        return StoredReward(session_id, version, new=True)

    def rescore(self, store: SessionStore, since: datetime) -> list[StoredReward]:
        """Re-score every ended session (finished, rejected or archived) that received feedback at or
        after `since`; a session still running is left for when it ends, as scoring leaves it."""
        ended = ", ".join(f"'{state.value}'" for state in sorted(TERMINAL))
        rows = store.sql(
            "SELECT DISTINCT f.session_id FROM feedback f JOIN sessions s ON s.session_id = f.session_id"
            f" WHERE f.received_at >= ? AND s.state IN ({ended}) ORDER BY f.session_id",
            (iso(since),),
        )
        return self.store_all(store, (str(r["session_id"]) for r in rows))

    def follow(self, store: SessionStore, after: int = 0) -> tuple[int, list[StoredReward]]:
        """Re-score the sessions that got feedback in the change feed after `after`.

        Returns the cursor to pass next time and what was stored. Delivery is at-least-once, which storing
        tolerates: an unchanged session keeps its reward version.
        """
        cursor, touched = after, dict[str, None]()
        while True:
            batch = store.changes(after=cursor, limit=1000)
            touched.update((c.session_id, None) for c in batch.changes if c.type == FEEDBACK_EVENT)
            if batch.cursor == cursor:
                break
            cursor = batch.cursor
        return cursor, self.store_all(store, touched)

    def store_all(self, store: SessionStore, session_ids: Iterable[str]) -> list[StoredReward]:
        """`score_and_store` each session, then save the learned statistics."""
        stored = [self.score_and_store(store, sid) for sid in session_ids]
        self.save_stats()
        return stored

    def save_stats(self) -> None:
        """Persist layer statistics and best step counts (when a stats file is configured)."""
        self.stats.save()


def _require_switched_on(source: RuleSource, names: set[str]) -> None:
    """Every user term must be switched on by the rule file: one that is not would be silently unused."""
    unused = sorted(names - set(source.current().file.terms))
    if unused:
        example = f"{unused[0]}: {{layer: completion}}"
        raise RuleFileError(
            str(source.path),
            f"terms {unused} were given to the engine but the file does not switch them on; "
            f"add them under `terms:` with their layer (e.g. `{example}`)",
        )


def contract_budgets(folder: Path) -> dict[str, float]:
    """p95 latency budgets (ms) of the skill contracts in a folder, by skill name."""
    contracts = load_contracts(folder)
    return {name: c.sla.p95_ms for name, c in contracts.items() if c.sla.p95_ms is not None}


FEEDBACK_EVENT = "feedback"
"""Change-feed type of an appended feedback event."""
