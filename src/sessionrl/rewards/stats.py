"""What the engine learns while scoring, kept per rule-set version: layer statistics and best step counts.

Both depend on the rules that produced the values, so they are keyed by the rule-set version: editing the
rules starts fresh statistics, and going back to an earlier file finds its statistics again. The file is
JSON, written atomically (temporary file, then rename):

    {"default@3f9c2a1b0e4d": {"layers": {"completion": [count, mean, m2], ...},
                              "best_steps": {"clinical_triage": 3, ...}}}
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessionrl.errors import SessionRLError
from sessionrl.rewards.layers import RunningStats


@dataclass
class Learned:
    """Running statistics of each layer's raw value, and the fewest tool calls per solved scenario."""

    layers: dict[str, RunningStats] = field(default_factory=dict)
    best_steps: dict[str, int] = field(default_factory=dict)

    def observe_layer(self, layer: str, raw: float) -> None:
        """Fold one raw layer value into that layer's statistics."""
        self.layers[layer] = self.layers.get(layer, RunningStats()).update(raw)

    def observe_steps(self, scenario: str, steps: int) -> None:
        """Record the tool-call count of a solved session if it beats the best known."""
        if steps > 0 and steps < self.best_steps.get(scenario, steps + 1):
            self.best_steps[scenario] = steps

    def to_json(self) -> dict[str, Any]:
        layers = {k: [s.count, s.mean, s.m2] for k, s in sorted(self.layers.items())}
        return {"layers": layers, "best_steps": dict(sorted(self.best_steps.items()))}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Learned:
        layers = {k: RunningStats(int(c), float(m), float(m2)) for k, (c, m, m2) in doc["layers"].items()}
        return cls(layers, {k: int(v) for k, v in doc["best_steps"].items()})


class StatsFileError(SessionRLError):
    """The statistics file exists but cannot be read."""


class StatsBook:
    """`Learned` state per rule-set version, in a JSON file (or only in memory when `path` is None)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._books: dict[str, Learned] = self._load() if path is not None and path.exists() else {}

    def get(self, version: str) -> Learned:
        """The state of a rule-set version (empty the first time)."""
        return self._books.setdefault(version, Learned())

    def save(self) -> None:
        """Write every version's state to the file (nothing to do in memory)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        doc = {version: book.to_json() for version, book in sorted(self._books.items())}
        tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
        os.replace(tmp, self.path)

    def _load(self) -> dict[str, Learned]:
        assert self.path is not None
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            return {version: Learned.from_json(book) for version, book in doc.items()}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StatsFileError(f"{self.path}: cannot read reward statistics: {exc!r}") from exc
