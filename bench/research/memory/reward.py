"""The memory layer's reward term: entity recall weighted by freshness.

`memory_recall(session, ctx)` rewards a session for carrying over what an earlier turn said: for each
entity a correct solution uses that the request does not name (`sessionrl.eval.levels.remembered`), the
first tool call that passes it earns `1/n`, times the freshness of the memory it came from (the youngest
`memory_search` hit naming it, weighted `0.5 ** (age / HALF_LIFE_S)`; 1 when no search named it, since
then the session recalled it from its own context). A session with nothing to remember earns 0.

Give it to `RewardEngine(terms=[memory_recall])`, or name `research.memory.reward:memory_recall` in a rule
file (with bench/ on the import path).
"""

from __future__ import annotations

import json

from research.memory.skills import MEMORY_SKILLS
from research.memory.store import HALF_LIFE_S, freshness
from sessionrl.eval.levels import remembered
from sessionrl.rewards import ScoringContext, TermResult
from sessionrl.session import CallStatus, Session


def hit_ages(session: Session) -> dict[str, float]:
    """The age of the youngest `memory_search` hit naming each entity, over the session's searches."""
    ages: dict[str, float] = {}
    for call in session.tool_calls:
        if (
            call.tool != "memory_search"
            or call.status != CallStatus.SUCCESS
            or not isinstance(call.output, dict)
        ):
            continue
        for hit in call.output.get("hits", []):
            for entity in hit.get("entities", []):
                ages[str(entity)] = min(ages.get(str(entity), float("inf")), float(hit.get("age_s", 0.0)))
    return ages


def memory_recall(session: Session, ctx: ScoringContext) -> TermResult:
    """Recall of the entities the request does not name, weighted by freshness (see the module doc)."""
    wanted = remembered(session)
    if not wanted:
        return TermResult(0.0, {}, "nothing to remember")
    ages = hit_ages(session)
    acting = [c for c in session.tool_calls if c.tool not in MEMORY_SKILLS]  # memory calls do not use it
    steps: dict[str, float] = {}
    recalled = 0
    for entity in wanted:
        call = next((c for c in acting if entity in json.dumps(c.params, ensure_ascii=False)), None)
        if call is None:
            continue
        recalled += 1
        weight = freshness(ages[entity], HALF_LIFE_S) if entity in ages else 1.0
        steps[call.call_id] = steps.get(call.call_id, 0.0) + weight / len(wanted)
    return TermResult(sum(steps.values()), steps, f"recalled {recalled} of {len(wanted)} remembered entities")


__all__ = ["hit_ages", "memory_recall"]
