"""Shared prefixes: sequences that begin alike are computed once up to where they part.

The K sequences of a GRPO group begin with the same prompt, and every sequence of a batch begins with the
same system prompt. In a packed micro-batch (`sessionrl.train.llm.data.concatenate`) such a prefix lies
once, as a segment of its own, and each sequence continuing it is a segment that attends to the prefix's
keys and values before its own, its positions continuing the prefix's
(`sessionrl.train.llm.packing.segment_attention`). Every token's hidden state is the one it has in its
sequence alone, and the gradient reaching a shared token is the sum of what each copy would receive, so
the loss and its gradients are those of the unshared layout, for fewer computed tokens.

Only a sequence's *key* is shared: its tokens before the one that predicts its first policy token. A
policy token and the token predicting it carry that sequence's own advantage and old log-probability, so
they stay in its own segment.

The segments are a compressed trie of the keys: sorted, each run of keys with a common prefix longer than
their parent's gets a node holding the extra tokens, and each sequence's remainder (from the deepest node
its key reaches to its end) is a leaf. Sorted keys next to each other share the most, so a sequence added
after its neighbour costs its length less their common prefix (`chunk_shared`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise


@dataclass(frozen=True, slots=True)
class Segment:
    """Positions ``[start, end)`` of sequence `sequence` (the same in every sequence below a shared node),
    which sees segment `parent` and that one's ancestors before itself (``-1``: nothing). A segment's
    `start` is how many tokens it sees before its own, so its positions are ``start .. end - 1``."""

    sequence: int
    start: int
    end: int
    parent: int = -1


def shareable(loss_mask: Sequence[bool]) -> int:
    """How many leading tokens of a sequence others may share: those before the token predicting its first
    policy token (all but the last when it has none).

    >>> shareable([False, False, False, True, True]), shareable([False, False]), shareable([True])
    (2, 1, 0)
    """
    first = next((i for i, m in enumerate(loss_mask) if m), len(loss_mask))
    return max(first - 1, 0)


def key_order(keys: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """Indices sorted by key, and how many leading tokens each key shares with the one before it (0 for
    the first).

    >>> key_order([(3, 1), (1, 2, 3), (1, 2)])
    ([2, 1, 0], [0, 2, 0])
    """
    order = sorted(range(len(keys)), key=lambda i: tuple(keys[i]))
    return order, [0] + [_common(keys[a], keys[b]) for a, b in pairwise(order)]


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def chunk_shared(keys: Sequence[Sequence[int]], lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices grouped into micro-batches of at most `budget` computed tokens: in key order, each costing
    its length less what it shares with the one before it in its micro-batch (a sequence longer than the
    budget gets one of its own).

    >>> chunk_shared([(1, 2, 3), (1, 2, 4), (9,)], [5, 5, 4], budget=8)
    [[0, 1], [2]]
    """
    order, common = key_order(keys)
    chunks: list[list[int]] = []
    load = 0
    for i, shared in zip(order, common, strict=True):
        if chunks and load + lengths[i] - shared <= budget:
            chunks[-1].append(i)
            load += lengths[i] - shared
        else:
            chunks.append([i])
            load = lengths[i]
    return chunks


def prefix_tree(keys: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[Segment]:
    """The segments of sequences of `lengths` whose keys are `keys` (each a prefix of its sequence, shorter
    than it): the keys' compressed trie, parents before children, then one leaf per sequence.

    >>> for s in prefix_tree([(1, 2, 3), (1, 2, 4), (7,)], [5, 4, 2]):
    ...     print(s)
    Segment(sequence=0, start=0, end=2, parent=-1)
    Segment(sequence=0, start=2, end=5, parent=0)
    Segment(sequence=1, start=2, end=4, parent=0)
    Segment(sequence=2, start=0, end=2, parent=-1)
    """
    if any(len(k) >= n for k, n in zip(keys, lengths, strict=True)):
        raise ValueError("a key must be shorter than its sequence, so each sequence keeps a segment")
    order, common = key_order(keys)
    segments: list[Segment] = []
    runs = [(0, len(order), 0, -1)] if order else []  # sorted slice [lo, hi) sharing `depth` tokens
    while runs:
        lo, hi, depth, parent = runs.pop()
        if hi - lo == 1:
            segments.append(Segment(order[lo], depth, lengths[order[lo]], parent))
            continue
        shared = min(common[lo + 1 : hi])
        if shared > depth:
            segments.append(Segment(order[lo], depth, shared, parent))
            depth, parent = shared, len(segments) - 1
        while len(keys[order[lo]]) == depth:  # keys that end here: their remainders are leaves
            segments.append(Segment(order[lo], depth, lengths[order[lo]], parent))
            lo += 1
            if lo == hi:
                break
        runs += reversed(_runs(common, lo, hi, depth, parent))
    return segments


def _runs(common: list[int], lo: int, hi: int, depth: int, parent: int) -> list[tuple[int, int, int, int]]:
    """The slice ``[lo, hi)`` split where neighbours share no more than `depth` tokens."""
    runs = []
    start = lo
    for i in range(lo + 1, hi + 1):
        if i == hi or common[i] <= depth:
            runs.append((start, i, depth, parent))
            start = i
    return runs


__all__ = ["Segment", "chunk_shared", "key_order", "prefix_tree", "shareable"]
