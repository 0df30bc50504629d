"""Several sources, one value: how the ratings of different annotators, validators and judges combine.

A session keeps one feedback item per (type, anchor, source) (`sessionrl.session.events`), so two
annotators who rate the same session both count. Where a reward reads such items (a feedback rule, the
judge's corrections, the session's rating), the values of one type on one anchor are first worked out
per item and then combined across their sources by the rule file's `aggregate`:

- `mean` (the default): the plain mean;
- `median`: the middle value (the mean of the two middle ones for an even count), robust to one outlier;
- `weighted`: the mean weighted by `source_weights` (sources not listed weigh `default_source_weight`).

Items of different types or anchors still add up, as before. Every combination says which sources it
took and what each gave (`Combined.note`), and that text goes into the term's explanation, so a reward
vector names every source behind it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from sessionrl.session.model import Feedback


class Aggregate(StrEnum):
    """How values of one kind on one anchor from several sources combine (see the module doc)."""

    MEAN = "mean"
    MEDIAN = "median"
    WEIGHTED = "weighted"


def combine(
    values: Sequence[tuple[str, float]],
    rule: Aggregate,
    weights: Mapping[str, float] | None = None,
    default_weight: float = 1.0,
) -> float:
    """One value from (source, value) pairs, by `rule`; weights (positive) are used by `weighted` only.

    >>> pairs = [("doc_007", 0.75), ("doc_012", 0.25)]
    >>> combine(pairs, Aggregate.MEAN)
    0.5
    >>> combine([*pairs, ("nurse_chen", 1.0)], Aggregate.MEDIAN)
    0.75
    >>> combine(pairs, Aggregate.WEIGHTED, {"doc_007": 3.0})  # (3 * 0.75 + 1 * 0.25) / 4
    0.625
    """
    if not values:
        raise ValueError("nothing to combine")
    numbers = [v for _, v in values]
    if rule is Aggregate.MEAN:
        return statistics.fmean(numbers)
    if rule is Aggregate.MEDIAN:
        return float(statistics.median(numbers))
    w = [(weights or {}).get(source, default_weight) for source, _ in values]
    return statistics.fmean(numbers, weights=w)


@dataclass(frozen=True, slots=True)
class Combined:
    """One group of feedback (same type, same anchor): its first item (for the anchor), its combined
    value, a note naming each source and its value, and the sources."""

    item: Feedback
    value: float
    note: str
    sources: tuple[str, ...]


def combine_feedback(
    scored: Iterable[tuple[Feedback, float]],
    rule: Aggregate,
    weights: Mapping[str, float] | None = None,
    default_weight: float = 1.0,
    label: Callable[[Feedback], str] = lambda f: f.feedback_id,
) -> list[Combined]:
    """Group (item, value) pairs by the item's type and anchor and combine each group over its sources.

    A group of one keeps its value and is noted `label(item) (source) value`; a larger group is noted
    `type on anchor: rule of source value, ... = combined`. Groups come in the order of their first item.
    """
    groups: dict[tuple[str, str], list[tuple[Feedback, float]]] = {}
    for item, value in scored:
        groups.setdefault((item.type.value, item.anchor.key), []).append((item, value))
    out = []
    for (kind, anchor), members in groups.items():
        first = members[0][0]
        if len(members) == 1:
            value = members[0][1]
            out.append(
                Combined(first, value, f"{label(first)} ({first.source}) {value:+.3g}", (first.source,))
            )
            continue
        value = combine([(f.source, v) for f, v in members], rule, weights, default_weight)
        each = ", ".join(f"{f.source} {v:+.3g}" for f, v in members)
        note = f"{kind} on {anchor}: {rule.value} of {each} = {value:+.3g}"
        out.append(Combined(first, value, note, tuple(f.source for f, _ in members)))
    return out
