"""The offline judge: deterministic keyword rules over the penalty table, for Chinese and English comments.

A comment is cut into clauses (at punctuation and at "but"/"但"). A clause that holds an omission cue
("未提及", "did not mention", "missing", ...) yields one correction per known element it names. The severity
is the one a severity cue in the same clause gives ("严重", "critical", "minor", ...), else the element's
default. The same element named twice keeps its highest severity.

>>> from sessionrl.rewards.judge.table import load_penalty_table
>>> judge, table = OfflineJudge(), load_penalty_table()
>>> judge.extract("诊断正确，但未提及需排除慢性病贫血", table)
(Correction(missing_element='chronic_disease_exclusion', severity=<Severity.HIGH: 'high'>),)
>>> judge.extract("Correct diagnosis, but did not mention excluding anemia of chronic disease", table)
(Correction(missing_element='chronic_disease_exclusion', severity=<Severity.HIGH: 'high'>),)
>>> judge.extract("Clear recommendation, guideline cited correctly.", table)
()
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sessionrl.rewards.judge.table import Correction, PenaltyTable, Severity

_CLAUSES = re.compile(r"[，。；;！？!?\n:：]|,\s*|\.\s+|\.$|\bbut\b|但是|但|不过|然而", re.IGNORECASE)
_RANK = {Severity.LOW: 0, Severity.MEDIUM: 1, Severity.HIGH: 2}


class OfflineJudge:
    """Keyword-rule extractor: no model, no network, the same answer every time."""

    name = "offline"

    def __init__(self) -> None:
        self._compiled: tuple[PenaltyTable, _Matchers] | None = None

    def extract(self, comment: str, table: PenaltyTable) -> tuple[Correction, ...]:
        """Corrections for every clause that both marks an omission and names a known element."""
        matchers = self._matchers(table)
        found: dict[str, Severity] = {}
        for clause in _CLAUSES.split(comment.lower()):
            if not matchers.missing.search(clause):
                continue
            severity = _severity(clause, matchers)
            for element, pattern in matchers.elements:
                if pattern.search(clause):
                    chosen = severity or table.elements[element].severity
                    if element not in found or _RANK[chosen] > _RANK[found[element]]:
                        found[element] = chosen
        return tuple(Correction(missing_element=e, severity=s) for e, s in found.items())

    def _matchers(self, table: PenaltyTable) -> _Matchers:
        """The table's patterns, compiled once per table."""
        if self._compiled is None or self._compiled[0] is not table:
            self._compiled = (table, _Matchers(table))
        return self._compiled[1]


class _Matchers:
    """Compiled patterns of one penalty table."""

    def __init__(self, table: PenaltyTable) -> None:
        self.missing = _pattern(table.cues.missing)
        self.severity = [(s, _pattern(words)) for s, words in table.cues.severity.items() if words]
        self.elements = [(name, _pattern(e.keywords)) for name, e in table.elements.items()]


def _severity(clause: str, matchers: _Matchers) -> Severity | None:
    """The highest severity a cue in the clause names, or None."""
    named = [s for s, pattern in matchers.severity if pattern.search(clause)]
    return max(named, key=_RANK.__getitem__) if named else None


def _pattern(words: Iterable[str]) -> re.Pattern[str]:
    """One alternation of the words, longest first; Latin words only match whole words."""
    parts = []
    for word in sorted({w.lower() for w in words}, key=len, reverse=True):
        escaped = re.escape(word)
        parts.append(rf"(?<![a-z]){escaped}(?![a-z])" if word.isascii() else escaped)
    return re.compile("|".join(parts))
