"""Long-term memory: facts and entities from past sessions, found again by meaning, newest first.

Short-term memory is the conversation itself; this is what outlives it. A `MemoryStore` is one SQLite
database (a file, or `:memory:`) with two tables:

    facts      subject, text, the entities it names, the session it came from, when it was written, and
               the text's embedding (float32 bytes)
    relations  (subject, relation, object) links, such as (phone, has_order, O-104233), with the session
               and time of the last write

`search(subject, query)` ranks a subject's facts by cosine similarity to the query times a freshness
weight `0.5 ** (age / half_life_s)`, so of two equally close facts the newer wins. Texts are embedded by a
`sessionrl.policy.encoder.TextEncoder`: the packaged local all-MiniLM-L6-v2 (`encoder="minilm"`, from the
optional `text` extra) or the hashed bag of words (`encoder="hash"`, no dependency); `"auto"` takes MiniLM
when it is installed. The encoder's name and width are kept in the database, and a store refuses to be
opened with another encoder than the one that wrote its vectors.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np

if TYPE_CHECKING:  # the encoders import torch: only when a store is opened
    from sessionrl.policy.encoder import EncoderKind, TextEncoder

DAY: Final = 86_400.0
HALF_LIFE_S: Final = 30 * DAY
"""How long a fact takes to lose half its weight, by default."""

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS facts (
    fact_id INTEGER PRIMARY KEY,
    subject TEXT NOT NULL,
    text TEXT NOT NULL,
    entities TEXT NOT NULL,
    session_id TEXT,
    written_at REAL NOT NULL,
    vector BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS facts_subject ON facts (subject, written_at);
CREATE TABLE IF NOT EXISTS relations (
    subject TEXT NOT NULL,
    relation TEXT NOT NULL,
    object TEXT NOT NULL,
    session_id TEXT,
    written_at REAL NOT NULL,
    PRIMARY KEY (subject, relation, object)
);
"""


class EncoderMismatch(ValueError):
    """The store's vectors were written by another encoder than the one it is opened with."""


@dataclass(frozen=True, slots=True)
class Hit:
    """One fact found: its text and entities, its score (similarity × freshness) and its age in seconds."""

    fact_id: int
    text: str
    entities: tuple[str, ...]
    score: float
    similarity: float
    age_s: float

    def as_json(self) -> dict[str, object]:
        """The hit as a `memory_search` answer item."""
        return {"text": self.text, "entities": list(self.entities), "score": self.score, "age_s": self.age_s}


@dataclass(frozen=True, slots=True)
class Relation:
    """One typed link from a subject to an entity."""

    subject: str
    relation: str
    object: str
    written_at: float


def freshness(age_s: float, half_life_s: float) -> float:
    """The weight of a fact `age_s` seconds old: 1 when new, halved every `half_life_s`.

    >>> freshness(0.0, 10.0), freshness(10.0, 10.0), freshness(20.0, 10.0)
    (1.0, 0.5, 0.25)
    """
    return float(0.5 ** (max(age_s, 0.0) / half_life_s))


class MemoryStore:
    """Facts and relations by subject in one SQLite database, searched by embedding (see the module doc)."""

    def __init__(
        self,
        path: str | Path = ":memory:",
        *,
        encoder: TextEncoder | EncoderKind = "auto",
        half_life_s: float = HALF_LIFE_S,
    ) -> None:
        if half_life_s <= 0:
            raise ValueError(f"MemoryStore needs half_life_s > 0, got {half_life_s}")
        from sessionrl.policy.encoder import build_encoder

        self.encoder = build_encoder(encoder) if isinstance(encoder, str) else encoder
        self.half_life_s = half_life_s
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.executescript(SCHEMA)
        self._check_encoder()

    @property
    def encoder_name(self) -> str:
        """`hash` or `minilm` (another encoder's class name otherwise), with its width."""
        kind = type(self.encoder).__name__.removesuffix("Encoder").lower()
        kind = {"hashing": "hash", "minilm": "minilm"}.get(kind, kind)
        return f"{kind}:{self.encoder.dim}"

    def _check_encoder(self) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'encoder'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta VALUES ('encoder', ?)", (self.encoder_name,))
        elif row[0] != self.encoder_name:
            raise EncoderMismatch(f"this memory was written with encoder {row[0]}, not {self.encoder_name}")

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def write(
        self,
        subject: str,
        text: str,
        entities: Iterable[str] = (),
        relations: Iterable[tuple[str, str]] = (),
        *,
        session_id: str | None = None,
        at: float | None = None,
    ) -> int:
        """Store one fact (and its relations) about `subject`; returns the fact's id."""
        at = time.time() if at is None else at
        vector = self._embed(text).tobytes()
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO facts (subject, text, entities, session_id, written_at, vector)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (subject, text, json.dumps(list(entities)), session_id, at, vector),
            )
            self._db.executemany(
                "INSERT OR REPLACE INTO relations VALUES (?, ?, ?, ?, ?)",
                [(subject, relation, obj, session_id, at) for relation, obj in relations],
            )
        return int(cursor.lastrowid or 0)

    def search(self, subject: str, query: str, k: int = 3, *, now: float | None = None) -> list[Hit]:
        """The `k` facts about `subject` that score highest for `query` (similarity × freshness)."""
        rows = self._db.execute(
            "SELECT fact_id, text, entities, written_at, vector FROM facts WHERE subject = ?", (subject,)
        ).fetchall()
        if not rows or k < 1:
            return []
        now = time.time() if now is None else now
        matrix = np.stack([np.frombuffer(row[4], dtype=np.float32) for row in rows])
        similarity = (matrix @ self._embed(query)).tolist()
        hits = [
            Hit(
                fact_id=int(fact_id),
                text=text,
                entities=tuple(json.loads(entities)),
                score=sim * freshness(now - written_at, self.half_life_s),
                similarity=sim,
                age_s=max(now - written_at, 0.0),
            )
            for (fact_id, text, entities, written_at, _), sim in zip(rows, similarity, strict=True)
        ]
        return sorted(hits, key=lambda h: (-h.score, -h.fact_id))[:k]

    def _embed(self, text: str) -> np.ndarray:
        return np.asarray(self.encoder.encode([text])[0].detach().cpu().float().numpy(), dtype=np.float32)

    def relations(self, subject: str, relation: str | None = None) -> list[Relation]:
        """The subject's relations (of one kind with `relation`), newest first."""
        sql = "SELECT subject, relation, object, written_at FROM relations WHERE subject = ?"
        params: tuple[str, ...] = (subject,)
        if relation is not None:
            sql += " AND relation = ?"
            params += (relation,)
        rows = self._db.execute(sql + " ORDER BY written_at DESC", params).fetchall()
        return [Relation(str(s), str(r), str(o), float(at)) for s, r, o, at in rows]

    def count(self, subject: str | None = None) -> int:
        """How many facts the store holds (about `subject` only, when given)."""
        if subject is None:
            return int(self._db.execute("SELECT COUNT(*) FROM facts").fetchone()[0])
        return int(self._db.execute("SELECT COUNT(*) FROM facts WHERE subject = ?", (subject,)).fetchone()[0])


__all__ = ["HALF_LIFE_S", "EncoderMismatch", "Hit", "MemoryStore", "Relation", "freshness"]
