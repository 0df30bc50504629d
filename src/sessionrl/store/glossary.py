"""A small bilingual glossary, so a comment search in one language finds comments written in the other.

Feedback arrives in English and in Chinese (the seed's expert wrote `诊断正确，但未提及需排除慢性病贫血`;
an English reviewer asks for "chronic disease"). Each entry of `TERMS` is one concept and its spellings.
The typed filter `comment_mentions` (`sessions query --comment-mentions`) matches a comment holding the
needle or, when the needle is one of those spellings (ASCII case ignored), any other spelling of the same
concept (`spellings`); `comment_contains` stays a literal substring test.

The same glossary is visible to SQL: every store has a view `glossary (concept, term)` and a view
`comment_terms (session_id, position, feedback_id, term)`, holding for each feedback comment every spelling
of each concept it mentions. So the typed query and a hand-written one agree:

    SELECT session_id FROM comment_terms WHERE term = 'chronic disease'

The views are computed when read (nothing is stored per comment), so a change to `TERMS` applies to every
stored comment at once: opening a store (re)makes its views when they are missing or were made from other
statements (SQLite remakes them on every open; PostgreSQL keeps their statements' hash in `store_meta`).
"""

from __future__ import annotations

from typing import Final

TERMS: Final[tuple[tuple[str, ...], ...]] = (
    ("chronic disease", "慢性病"),
    ("anemia", "anaemia", "贫血"),
    ("iron deficiency", "缺铁"),
    ("diagnosis", "诊断"),
    ("differential diagnosis", "鉴别诊断"),
    ("guideline", "指南"),
    ("blood test", "血常规"),
    ("refund", "退款"),
    ("wrong address", "地址填错", "地址错误"),
    ("damaged", "损坏"),
    ("late delivery", "延迟", "迟到"),
    ("lost parcel", "丢件", "包裹丢失"),
    ("wrong item", "发错货"),
    ("out of stock", "缺货"),
    ("rude", "态度差"),
)
"""Concepts, each as its spellings: English first, then Chinese. Spellings hold no `%`, `_` or quote."""

_CONCEPTS: Final = {spelling.casefold(): group for group in TERMS for spelling in group}


def spellings(needle: str) -> tuple[str, ...]:
    """The texts a comment search for `needle` looks for: `needle`, and when it is a glossary term, every
    other spelling of its concept.

    >>> spellings("Chronic disease")
    ('Chronic disease', '慢性病')
    >>> spellings("CRP")
    ('CRP',)
    """
    group = _CONCEPTS.get(needle.strip().casefold(), ())
    return (needle, *(s for s in group if s.casefold() != needle.strip().casefold()))


DROP_VIEWS: Final = ("DROP VIEW IF EXISTS comment_terms", "DROP VIEW IF EXISTS glossary")
"""Statements that remove the glossary's views (before a migration renames the tables they read)."""


def view_ddl(like: str, collate: str = "") -> tuple[str, ...]:
    """Statements that (re)create the views `glossary` and `comment_terms`; `like` is the backend's
    ASCII-case-insensitive pattern operator (`LIKE` on SQLite, `ILIKE` on PostgreSQL), `collate` the
    clause that gives the pattern the comment column's collation where the backend needs it."""
    rows = ", ".join(f"('{group[0]}', '{term}')" for group in TERMS for term in group)
    return (
        *DROP_VIEWS,
        f"CREATE VIEW glossary (concept, term) AS VALUES {rows}",
        "CREATE VIEW comment_terms (session_id, position, feedback_id, term) AS"
        " SELECT DISTINCT f.session_id, f.position, f.feedback_id, t.term"
        f" FROM feedback f JOIN glossary g ON f.comment {like} ('%' || g.term || '%'){collate}"
        " JOIN glossary t ON t.concept = g.concept",
    )


def _check_terms() -> None:
    for group in TERMS:
        for term in group:
            if any(ch in term for ch in "%_'\\\"") or not term.strip():
                raise ValueError(f"glossary term {term!r} holds a character that SQL would read")


_check_terms()
