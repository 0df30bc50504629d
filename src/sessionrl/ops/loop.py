"""The continuous loop: follow the change feed, re-score, attribute failures, retrain, gate, canary.

One cycle (`run_cycle`), every `interval_s`:

1. **feed**: the sessions that changed since the loop's cursor (new sessions, late feedback), read from the
   store's change feed; the cursor is kept in the store (`ops_settings`), so a restarted loop reads on;
2. **re-score**: each of them that has ended is scored by the reward engine (a new reward version when
   its feedback changed);
3. **canary**: when the policy has a canary, it is checked (`sessionrl.ops.canary`) and the cycle ends:
   one release at a time;
4. **attribute**: the ended sessions production served are attributed by root cause
   (`sessionrl.eval.metrics.failure_attribution`); a class whose share of sessions passes its threshold
   (over at least `min_sessions` sessions) triggers training; a session judged failed with none of those
   causes counts as `wrong_answer`; a cycle whose feed brought no change attributes nothing (it would
   only repeat the last cycle's decision);
5. **train**: a sample of that class's sessions is written to the run folder (`sample.json`) and the
   configured training run (`train:`, any LLM trainer of `sessionrl train`) runs in a new folder;
6. **gate**: the exported policy's evaluation must reach `min_success`;
7. **register and canary**: it is registered as a candidate with its lineage (run, data cursor, reward
   rules, parent version, the class that triggered it) and started as a canary on `ops.canary.share`.

Every decision is a line of the operations log (kind `loop`), which `sessionrl policies log --kind loop`
and the dashboard show.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sessionrl.episodes.verdict import task_success
from sessionrl.eval.metrics import failure_attribution
from sessionrl.ops.analysis import served_sessions
from sessionrl.ops.canary import check_canary
from sessionrl.ops.config import OpsConfig
from sessionrl.ops.registry import Lineage, PolicyRegistry, PolicyVersion, Stage
from sessionrl.rewards.engine import RewardConfig, RewardEngine
from sessionrl.session.lifecycle import TERMINAL
from sessionrl.session.model import Session
from sessionrl.store import SessionStore
from sessionrl.train.config import EXPORTED, RunConfig
from sessionrl.train.llm.feed import changed_sessions

CURSOR_KEY = "loop_cursor"
"""The `ops_settings` key of the loop's change-feed cursor."""
FEED_TYPES = frozenset({"session_created", "state_changed", "feedback", "session_patched"})
"""Change types after which a session may need scoring or attribution."""
WRONG_ANSWER = "wrong_answer"
"""The class of a session judged failed although no tool or plan failure explains it."""


class LoopConfig(BaseModel):
    """`sessionrl loop CONFIG`: the store, the operations config, the training run, the thresholds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    db: str = Field(default="sqlite:///runs/sessions.db", description="The store the service writes to.")
    ops: OpsConfig = Field(default_factory=OpsConfig, description="Policy, canary rules, webhook.")
    train: Path = Field(description="A `sessionrl train` config (sft, grpo or dpo) each retraining runs.")
    runs_dir: Path = Field(default=Path("runs/loop"), description="Each retraining's run folder goes here.")
    threshold: float = Field(
        default=0.05, gt=0, le=1, description="Share of sessions that triggers training."
    )
    thresholds: dict[str, float] = Field(
        default_factory=dict, description="Per failure class thresholds (timeout, bad_params, ...)."
    )
    min_sessions: int = Field(default=20, ge=1, description="Ended production sessions needed to attribute.")
    sample: int = Field(default=64, ge=1, description="Sessions of the class sampled for the run.")
    min_success: float = Field(default=0.0, ge=0, le=1, description="Gate: the new policy's success.")
    interval_s: float = Field(default=60.0, ge=0, description="Seconds between cycles.")
    rewards: RewardConfig = Field(default_factory=RewardConfig, description="How sessions are re-scored.")
    seed: int = Field(default=0, description="Seeds the sampling of sessions.")

    @field_validator("train")
    @classmethod
    def _llm_trainer(cls, path: Path) -> Path:
        trainer = RunConfig.load(path).trainer
        if trainer not in EXPORTED:
            raise ValueError(f"the loop retrains LLM policies (sft, grpo, dpo); {path} trains {trainer}")
        return path

    @classmethod
    def load(cls, path: str | Path) -> LoopConfig:
        """Read a YAML loop config (relative paths are taken from the current folder)."""
        return cls.model_validate(yaml.safe_load(Path(path).read_text()) or {})


@dataclass
class CycleReport:
    """What one cycle saw and decided."""

    cursor: int
    changed: int = 0
    rescored: int = 0
    shares: dict[str, float] = field(default_factory=dict)
    decision: str = "idle"
    detail: dict[str, Any] = field(default_factory=dict)


Trainer_ = Callable[[RunConfig], Any]
"""Runs a training config (by default `sessionrl.train.dispatch.run_trainer`) and returns its result."""


def default_trainer(config: RunConfig) -> Any:
    """`run_trainer` (imported when the loop first trains: torch is heavy)."""
    from sessionrl.train.dispatch import run_trainer

    return run_trainer(config)


class Loop:
    """The cycle of the module doc over one store. `run_cycle()` once, or `run(cycles)` on a schedule."""

    def __init__(
        self, config: LoopConfig, store: SessionStore, *, trainer: Trainer_ = default_trainer
    ) -> None:
        self.config = config
        self.store = store
        self.registry = PolicyRegistry(store)
        self.rewards = RewardEngine(config.rewards)
        self.trainer = trainer

    def run(
        self, cycles: int | None = None, *, sleep: Callable[[float], None] = time.sleep
    ) -> list[CycleReport]:
        """Run `cycles` cycles (forever when None), `interval_s` apart."""
        reports: list[CycleReport] = []
        while cycles is None or len(reports) < cycles:
            if reports:
                sleep(self.config.interval_s)
            reports.append(self.run_cycle())
        return reports

    def run_cycle(self) -> CycleReport:
        """One cycle (see the module doc); its decision is logged."""
        policy = self.config.ops.policy
        after = int(self.registry.setting(CURSOR_KEY) or 0)
        cursor, changed = changed_sessions(self.store, after, FEED_TYPES)
        report = CycleReport(cursor=cursor, changed=len(changed))
        ended = [s for s in (self.store.get(sid) for sid in changed) if s.state in TERMINAL]
        report.rescored = sum(
            r.new for r in self.rewards.store_all(self.store, [s.session_id for s in ended])
        )
        self.registry.set_setting(CURSOR_KEY, str(cursor), log=False)  # the loop line below has it
        if self.registry.canary(policy) is not None:
            verdict = check_canary(self.registry, self.config.ops)
            report.decision = f"canary_{verdict.action}" if verdict else "idle"
            report.detail = verdict.summary() if verdict else {}
        else:
            self._attribute_and_train(report)
        self.registry.record(
            "loop",
            {
                "decision": report.decision,
                "cursor": cursor,
                "changed": report.changed,
                "rescored": report.rescored,
                "shares": report.shares,
                **report.detail,
            },
            policy=policy,
        )
        return report

    def _attribute_and_train(self, report: CycleReport) -> None:
        production = self.registry.production(self.config.ops.policy)
        if production is None:
            report.decision = "no_production"
            return
        if report.changed == 0:  # what was attributed last cycle still holds: no retraining on the same data
            report.decision = "no_changes"
            return
        served = [
            s
            for s in served_sessions(self.store, production.policy, production.version)
            if s.state in TERMINAL
        ]
        report.shares = class_shares(served)
        if len(served) < self.config.min_sessions:
            report.decision = "too_few_sessions"
            report.detail = {"sessions": len(served), "needed": self.config.min_sessions}
            return
        over = {
            c: share
            for c, share in report.shares.items()
            if share > self.config.thresholds.get(c, self.config.threshold)
        }
        if not over:
            report.decision = "below_threshold"
            return
        failure = max(over, key=lambda c: (over[c], c))
        self._retrain(report, production, failure, served)

    def _retrain(
        self, report: CycleReport, production: PolicyVersion, failure: str, served: Sequence[Session]
    ) -> None:
        policy = production.policy
        version = len(self.registry.versions(policy)) + 1
        run_dir = self.config.runs_dir / f"{policy}-v{version}"
        sample = sample_class(served, failure, self.config.sample, seed=self.config.seed)
        run_config = RunConfig.load(self.config.train).model_copy(update={"run_dir": run_dir})
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "sample.json").write_bytes(orjson.dumps({"class": failure, "sessions": sample}))
        self.registry.record(
            "loop",
            {"decision": "train", "class": failure, "run_dir": str(run_dir), "sampled": len(sample)},
            policy=policy,
        )
        result = self.trainer(run_config)
        label = EXPORTED[run_config.trainer]
        evaluation = result.report[label].metrics.as_dict() if label in result.report else {}
        success = float(evaluation.get("success", 0.0))
        lineage = Lineage(
            run_dir=str(run_dir),
            data_cursor=report.cursor,
            ruleset_version=self.rewards.ruleset.version,
            parent=production.version,
            trainer=run_config.trainer.value,
            note=f"{failure} in {report.shares[failure]:.1%} of production's sessions; {len(sample)} sampled",
        )
        report.detail = {
            "class": failure,
            "run_dir": str(run_dir),
            "success": success,
            "sampled": len(sample),
        }
        if success < self.config.min_success:
            report.decision = "gate_failed"
            return
        candidate = self.registry.register(
            policy, str(run_dir / f"{label}_policy"), lineage=lineage, evaluation=evaluation
        )
        self.registry.promote(
            policy,
            candidate.version,
            Stage.CANARY,
            share=self.config.ops.canary.share,
            reason=f"loop: {failure}",
        )
        report.decision = "canary_started"
        report.detail |= {"version": candidate.version, "share": self.config.ops.canary.share}


def class_shares(sessions: Sequence[Session]) -> dict[str, float]:
    """For each failure class, the share of `sessions` showing it at least once.

    >>> class_shares([])
    {}
    """
    if not sessions:
        return {}
    counts: Counter[str] = Counter()
    for s in sessions:
        counts.update(session_classes(s))
    return {c: n / len(sessions) for c, n in sorted(counts.items())}


def session_classes(session: Session) -> set[str]:
    """The failure classes a session shows (`failure_attribution`'s), or `wrong_answer` for a session
    judged failed that shows none of them (every call worked, the answer did not)."""
    classes = set(failure_attribution([session]))
    if not classes and task_success(session) is False:
        classes.add(WRONG_ANSWER)
    return classes


def sample_class(sessions: Sequence[Session], failure: str, size: int, *, seed: int) -> list[str]:
    """Ids of up to `size` sessions showing `failure`, drawn without replacement (sorted)."""
    ids = sorted(s.session_id for s in sessions if failure in session_classes(s))
    return sorted(random.Random(seed).sample(ids, min(size, len(ids))))
