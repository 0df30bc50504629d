"""A reward term of your own, next to the shipped rules: written in Python, checked, switched on by name.

    .venv/bin/python examples/rewards/custom_term.py [--n 60]

`abandoned_failures` costs 0.3 for each failed tool call that no later call of the same tool made good,
credited to the failed call: a look across calls that a CEL rule, which sees one call at a time, cannot
take. The engine checks the term with `check_reward_term` when it is given, and `custom_term.yaml`
switches it on in the `completion` layer, beside the CEL rules and the built-in terms. The file could
import it instead, without the engine being told:
`abandoned_failures: {layer: completion, function: my_package.rewards:abandoned_failures}`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sessionrl.rewards import RewardConfig, RewardEngine, RewardVector, ScoringContext, TermResult
from sessionrl.session import CallStatus, Session, SessionState
from sessionrl.store import SessionStore
from sessionrl.store.synthetic import ingest

RULES = Path(__file__).with_name("custom_term.yaml")


def abandoned_failures(session: Session, ctx: ScoringContext) -> TermResult:
    """-0.3 for each failed tool call with no later success of the same tool, credited to that call."""
    calls = session.tool_calls
    steps = {
        c.call_id: -0.3
        for i, c in enumerate(calls)
        if c.status is not CallStatus.SUCCESS
        and not any(later.tool == c.tool and later.status is CallStatus.SUCCESS for later in calls[i + 1 :])
    }
    return TermResult(sum(steps.values()), steps, f"{len(steps)} of {len(calls)} calls failed for good")


def run(n: int) -> list[RewardVector]:
    """Score `n` generated sessions with the custom term switched on; the vectors of the finished ones."""
    engine = RewardEngine(RewardConfig(rules=RULES), terms=[abandoned_failures])
    with SessionStore.open("sqlite://") as store:
        ingest(store, n, seed=5)
        return [engine.score(store.get(sid)) for sid in store.session_ids(SessionState.FINISHED)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=60, help="sessions to generate")
    vectors = run(parser.parse_args().n)
    paid = [v for v in vectors if any(t.name == "abandoned_failures" and t.value for t in v.terms)]
    print(f"{len(vectors)} finished sessions scored, {len(paid)} paid for failures left unmended")
    for vector in paid[:3]:
        term = next(t for t in vector.terms if t.name == "abandoned_failures")
        print(f"  {vector.session_id}: {term.value:+.2f} ({term.explanation}) steps {term.steps}")


if __name__ == "__main__":
    main()
