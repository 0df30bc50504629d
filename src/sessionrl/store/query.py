"""Typed session queries over the query tables.

A `SessionQuery` compiles to one WHERE clause on `sessions s` whose side conditions are
`s.session_id IN (SELECT session_id FROM <side table> WHERE ...)`: each side table is searched once
(through its index where there is one) rather than once per session, so a question's cost follows the
rows it matches rather than the number of sessions stored. `comment_contains` is spelled by the backend
(`Backend.feedback_conditions`); SQLite's finds its feedback rows through the trigram index
`feedback_text` (see `sessionrl.store.dialect`) rather than by scanning every comment. `comment_mentions`
looks for each spelling the bilingual glossary gives its needle (`sessionrl.store.glossary`) the same way.
The same question written by hand against `store.sql` gives the same answer (for `comment_mentions`,
through the `comment_terms` view).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sessionrl.session.model import FeedbackType, SessionState
from sessionrl.store.backend import Backend, Connection
from sessionrl.store.dialect import contains_pattern
from sessionrl.store.documents import iso
from sessionrl.store.glossary import spellings
from sessionrl.store.projector import COLUMNS
from sessionrl.store.records import SessionRow

SHARE_OPS = ("<=", ">=", "<", ">")


class ToolShare(BaseModel):
    """A bound on one tool's share of a session's own tool calls, such as `crp_test_request<0.3`.

    Sessions without tool calls have no share and never match.

    >>> ToolShare.parse("crp_test_request<0.3")
    ToolShare(tool='crp_test_request', op='<', share=0.3)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str = Field(min_length=1, max_length=200)
    op: Literal["<", "<=", ">", ">="]
    share: float = Field(ge=0.0, le=1.0, description="A fraction of the session's tool calls, 0 to 1.")

    @classmethod
    def parse(cls, text: str) -> ToolShare:
        """Read `TOOL<0.3` (or <=, >, >=); `ValueError` says what is expected."""
        for op in SHARE_OPS:
            tool, sep, share = text.partition(op)
            if sep:
                try:
                    return cls.model_validate({"tool": tool.strip(), "op": op, "share": float(share)})
                except ValidationError as exc:
                    raise ValueError(f"{text!r}: {exc.errors()[0]['msg']}") from None
                except ValueError as exc:
                    raise ValueError(f"{text!r}: {exc}") from None
        raise ValueError(f"{text!r}: expected TOOL<SHARE (or <=, >, >=), such as crp_test_request<0.3")


class SessionQuery(BaseModel):
    """Which sessions to return. Unset filters match everything; set ones must all hold.

    The feedback filters (`feedback_type`, `comment_contains`, `comment_mentions`, `min_score`,
    `max_score`) must all hold for the same piece of feedback. A `comment_contains` of three characters
    or more is looked up in the trigram text index; a shorter one scans the comments.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    state: SessionState | None = None
    scenario: str | None = None
    tags: tuple[str, ...] = Field(default=(), description="Sessions carrying every one of these tags.")
    user_id: str | None = None
    tool_called: str | None = Field(default=None, description="Sessions with a call to this tool.")
    tool_failed: str | None = Field(default=None, description="Sessions where a call to this tool failed.")
    tool_share: ToolShare | None = Field(
        default=None, description="Sessions in which one tool's share of their own tool calls is bounded."
    )
    feedback_type: FeedbackType | None = None
    comment_contains: str | None = Field(
        default=None, min_length=1, description="Feedback comment contains this text (ASCII case ignored)."
    )
    comment_mentions: str | None = Field(
        default=None,
        min_length=1,
        description="Feedback comment contains this text or, for a glossary term, its translation.",
    )
    min_score: float | None = Field(default=None, description="Feedback score at least this.")
    max_score: float | None = Field(default=None, description="Feedback score at most this.")
    text: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Free text in the query, answer, messages, tool outputs or comments: every word (or a "
        "glossary term, with its other spellings) somewhere in the session, case ignored.",
    )
    scenario_contains: str | None = Field(
        default=None, min_length=1, description="Scenario contains this text (a prefix, or any part of it)."
    )
    outcome: Literal["solved", "failed", "unjudged"] | None = Field(
        default=None, description="The task verdict: the latest `task_outcome` feedback, or none."
    )
    failed_calls: bool | None = Field(
        default=None, description="True: some tool or LLM call failed (or was judged failed); False: none."
    )
    error_code: str | None = Field(default=None, min_length=1, description="A call ended with this code.")
    policy_version: int | None = Field(
        default=None, description="Highest policy version among its LLM calls."
    )
    stage: str | None = Field(
        default=None, min_length=1, description="The stage its metadata names (rl, ...)."
    )
    min_reward: float | None = Field(default=None, description="Latest session reward at least this.")
    max_reward: float | None = Field(default=None, description="Latest session reward at most this.")
    reward_ruleset: str | None = Field(
        default=None,
        min_length=1,
        description="Read the reward bounds on this ruleset version's latest reward.",
    )
    min_duration_ms: float | None = Field(
        default=None, ge=0, description="First start to last end, at least."
    )
    max_duration_ms: float | None = Field(default=None, ge=0, description="First start to last end, at most.")
    created_after: datetime | None = Field(default=None, description="Created at or after this time.")
    created_before: datetime | None = Field(default=None, description="Created strictly before this time.")
    order_by: Literal["created_at", "updated_at", "session_id"] = "created_at"
    descending: bool = False
    limit: int = Field(default=100, ge=1, le=100_000)
    offset: int = Field(default=0, ge=0)

    @field_validator("tool_share", mode="before")
    @classmethod
    def _share_text(cls, value: Any) -> Any:
        return ToolShare.parse(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _ranges(self) -> SessionQuery:
        if self.min_score is not None and self.max_score is not None and self.min_score > self.max_score:
            raise ValueError("min_score is greater than max_score")
        return self


Where = tuple[list[str], list[Any]]


def where(q: SessionQuery, backend: Backend) -> Where:
    """The conditions (on `sessions s`) and parameters of a query, ignoring order, limit and offset; the
    feedback text filter is spelled by `backend`."""
    conds: list[str] = []
    params: list[Any] = []
    for column, value in (("state", q.state), ("scenario", q.scenario), ("user_id", q.user_id)):
        if value is not None:
            conds.append(f"s.{column} = ?")
            params.append(value)
    for tag in dict.fromkeys(q.tags):
        conds.append("s.session_id IN (SELECT session_id FROM session_tags WHERE tag = ?)")
        params.append(tag)
    if q.tool_called is not None:
        conds.append("s.session_id IN (SELECT session_id FROM tool_calls WHERE tool = ?)")
        params.append(q.tool_called)
    if q.tool_failed is not None:
        conds.append(
            "s.session_id IN (SELECT session_id FROM tool_calls WHERE tool = ? AND status <> 'success')"
        )
        params.append(q.tool_failed)
    if q.tool_share is not None:  # count < share * calls: exact, with no division
        conds.append(
            "s.session_id IN (SELECT session_id FROM tool_calls GROUP BY session_id"
            f" HAVING SUM(CASE WHEN tool = ? THEN 1 ELSE 0 END) {q.tool_share.op} ? * COUNT(*))"
        )
        params += [q.tool_share.tool, q.tool_share.share]
    _feedback(q, backend, conds, params)
    _summary(q, backend, conds, params)
    if q.created_after is not None:
        conds.append("s.created_at >= ?")
        params.append(iso(q.created_after))
    if q.created_before is not None:
        conds.append("s.created_at < ?")
        params.append(iso(q.created_before))
    return conds, params


def _feedback(q: SessionQuery, backend: Backend, conds: list[str], params: list[Any]) -> None:
    kind = q.feedback_type.value if q.feedback_type is not None else None
    inner, values = backend.feedback_conditions(kind, q.comment_contains)
    params.extend(values)
    if q.comment_mentions is not None:
        alternatives = []
        for spelling in spellings(q.comment_mentions):
            conds_one, values = backend.feedback_conditions(None, spelling)
            alternatives.append(" AND ".join(conds_one))
            params.extend(values)
        inner.append("(" + " OR ".join(f"({a})" for a in alternatives) + ")")
    if q.min_score is not None:
        inner.append("score >= ?")
        params.append(q.min_score)
    if q.max_score is not None:
        inner.append("score <= ?")
        params.append(q.max_score)
    if inner:
        conds.append(f"s.session_id IN (SELECT session_id FROM feedback WHERE {' AND '.join(inner)})")


def _summary(q: SessionQuery, backend: Backend, conds: list[str], params: list[Any]) -> None:
    """The session list's filters: text, scenario part, verdict, failures, errors, policy, stage, reward
    and duration (tables of `sessionrl.store.summary`)."""
    if q.text is not None:
        for spelt in search_terms(q.text):
            found, values = backend.text_sessions(spelt)
            conds.append(f"s.session_id IN ({found})")
            params.extend(values)
    if q.scenario_contains is not None:
        conds.append("LOWER(s.scenario) LIKE ? ESCAPE '\\'")  # ASCII case ignored on both engines
        params.append(contains_pattern(q.scenario_contains.lower()))
    facts: list[str] = []
    if q.outcome is not None:
        facts.append(
            {"solved": "outcome = 1", "failed": "outcome = 0", "unjudged": "outcome IS NULL"}[q.outcome]
        )
    if q.failed_calls is not None:
        facts.append("failed_calls > 0" if q.failed_calls else "failed_calls = 0")
    for column, value, op in (
        ("policy_version", q.policy_version, "="),
        ("stage", q.stage, "="),
        ("duration_ms", q.min_duration_ms, ">="),
        ("duration_ms", q.max_duration_ms, "<="),
    ):
        if value is not None:
            facts.append(f"{column} {op} ?")
            params.append(value)
    if facts:
        conds.append(f"s.session_id IN (SELECT session_id FROM session_facts WHERE {' AND '.join(facts)})")
    if q.error_code is not None:
        conds.append("s.session_id IN (SELECT session_id FROM session_errors WHERE code = ?)")
        params.append(q.error_code)
    _reward(q, backend, conds, params)


def _reward(q: SessionQuery, backend: Backend, conds: list[str], params: list[Any]) -> None:
    """Bounds on the session reward of each session's latest reward (of `reward_ruleset` when set)."""
    if q.min_reward is None and q.max_reward is None:
        return
    ruleset = "" if q.reward_ruleset is None else " AND r2.ruleset_version = ?"
    inner = [
        f"r.version = (SELECT MAX(r2.version) FROM rewards r2 WHERE r2.session_id = r.session_id{ruleset})"
    ]
    params.extend([] if q.reward_ruleset is None else [q.reward_ruleset])
    for bound, op in ((q.min_reward, ">="), (q.max_reward, "<=")):
        if bound is not None:
            inner.append(f"{backend.reward_total} {op} ?")
            params.append(bound)
    conds.append(f"s.session_id IN (SELECT r.session_id FROM rewards r WHERE {' AND '.join(inner)})")


def search_terms(text: str) -> list[tuple[str, ...]]:
    """What a free-text search looks for: one group of spellings per word, every group must be found. A
    text that is a glossary term as a whole is one group of its spellings.

    >>> search_terms("chronic disease")
    [('chronic disease', '慢性病')]
    >>> search_terms(" CRP  ferritin ")
    [('CRP',), ('ferritin',)]
    """
    whole = spellings(text.strip())
    if len(whole) > 1:
        return [whole]
    return [spellings(word) for word in dict.fromkeys(text.split())]


def _clause(conds: list[str]) -> str:
    return f" WHERE {' AND '.join(conds)}" if conds else ""


def select_rows(conn: Connection, backend: Backend, q: SessionQuery) -> list[SessionRow]:
    """The sessions a query matches, ordered (ties broken by id) and paged."""
    conds, params = where(q, backend)
    direction = "DESC" if q.descending else "ASC"
    cols = ", ".join(f"s.{c}" for c in COLUMNS["sessions"])
    sql = (
        f"SELECT {cols} FROM sessions s{_clause(conds)}"
        f" ORDER BY s.{q.order_by} {direction}, s.session_id {direction} LIMIT ? OFFSET ?"
    )
    return [_row(r) for r in conn.execute(sql, [*params, q.limit, q.offset])]


def count(conn: Connection, backend: Backend, *queries: SessionQuery) -> int:
    """How many sessions match every one of the queries (order, limit and offset are ignored)."""
    conds: list[str] = []
    params: list[Any] = []
    for q in queries:
        c, p = where(q, backend)
        conds += c
        params += p
    return int(conn.execute(f"SELECT COUNT(*) FROM sessions s{_clause(conds)}", params).fetchone()[0])


def _row(r: tuple[Any, ...]) -> SessionRow:
    (sid, trace, state, scenario, tags, user, query, root, n_sub, n_tool, n_llm, n_fb, out, sv, ca, ua) = r
    return SessionRow(
        session_id=sid,
        trace_id=trace,
        state=SessionState(state),
        scenario=scenario,
        tags=tuple(orjson.loads(tags)),
        user_id=user,
        user_query=query,
        root_goal=root,
        n_subgoals=n_sub,
        n_tool_calls=n_tool,
        n_llm_calls=n_llm,
        n_feedback=n_fb,
        final_output=out,
        state_version=sv,
        created_at=datetime.fromisoformat(ca),
        updated_at=datetime.fromisoformat(ua),
    )
