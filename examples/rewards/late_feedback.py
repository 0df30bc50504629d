"""Reward shaping on generated traffic: score a store, let late feedback arrive, re-score, fill the gaps.

    .venv/bin/python examples/rewards/late_feedback.py [--n 400]

1. Generate sessions into an in-memory store and score every finished one (reward version 1).
2. A reviewer rates one session a day later: "诊断正确，但未提及需排除慢性病贫血" with 4 stars. Re-scoring
   what received feedback since then gives that session version 2; version 1 stays readable.
3. Fit the counterfactual reward model on the rated sessions, report its held-out quality, and list the
   unrated sessions most worth annotating next.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import timedelta

from sessionrl.rewards import RewardEngine, RewardVector
from sessionrl.rewards.sparse import ModelReport, QueueItem, RewardModel, uncertainty_queue
from sessionrl.session import Feedback, FeedbackAdded, FeedbackType, SessionState
from sessionrl.store import SessionStore
from sessionrl.store.synthetic import ingest

COMMENT = "诊断正确，但未提及需排除慢性病贫血"


@dataclass(frozen=True)
class Outcome:
    """What the walk-through produced."""

    scored: int
    before: RewardVector
    after: RewardVector
    report: ModelReport
    queue: list[QueueItem]


def run(n: int) -> Outcome:
    with SessionStore.open("sqlite://") as store:
        ingest(store, n, seed=11)
        engine = RewardEngine()
        finished = store.session_ids(SessionState.FINISHED)
        engine.store_all(store, finished)

        target = finished[0]
        session = store.get(target)
        arrived = session.updated_at + timedelta(days=1)
        rating = Feedback(
            type=FeedbackType.HUMAN_RATING,
            score=4.0,
            comment=COMMENT,
            annotator="dr_li",
            occurred_at=arrived,
            received_at=arrived,
        )
        store.append(target, FeedbackAdded(feedback=rating, at=arrived))
        engine.rescore(store, since=arrived)

        before = RewardVector.model_validate(store.reward(target, 1).vector)
        after = RewardVector.model_validate(store.reward(target).vector)
        sessions = list(store.iter_sessions())
        model = RewardModel()
        report = model.fit(sessions)
        return Outcome(len(finished), before, after, report, uncertainty_queue(model, sessions, k=5))


def show(outcome: Outcome) -> None:
    after = outcome.after
    print(f"scored {outcome.scored} finished sessions under {after.ruleset_version}")
    before, now = outcome.before.session_reward, after.session_reward
    print(f"{after.session_id}: session reward {before:+.3f} (version 1) -> {now:+.3f} (version 2)")
    for term in after.terms:
        if term.value:
            print(f"  {term.name:<18} {term.value:+.3f}  {term.explanation}")
    r = outcome.report
    auc = "n/a" if r.auc is None else f"{r.auc:.3f}"
    print(f"reward model: MAE {r.mae:.3f} (mean-only {r.baseline_mae:.3f}), AUC(rating > 3) {auc}")
    print("annotate next:", ", ".join(f"{i.session_id} [{i.low:.1f}, {i.high:.1f}]" for i in outcome.queue))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=400, help="sessions to generate")
    show(run(parser.parse_args().n))


if __name__ == "__main__":
    main()
