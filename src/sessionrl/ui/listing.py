"""The session list's form as a typed store query, and what each listed row shows beyond the `sessions`
row: the task verdict, failed calls, error codes, the latest reward and its ruleset, duration, policy
version and stage (the tables of `sessionrl.store.summary`, read for one page of rows at a time).

The query parameters are those docs/dashboard.md lists; a run's pages link to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from sessionrl.session.model import FeedbackType
from sessionrl.store import SessionQuery, SessionRow, SessionStore

OUTCOMES = ("solved", "failed", "unjudged")
ORDERS = ("created_at", "updated_at", "session_id")
LINK_KEEPS = ("run",)
"""Parameters a state count's link keeps (a run's counts stay that run's)."""


def list_query(params: dict[str, str], page_size: int) -> SessionQuery:
    """The typed query the list's form asks (empty fields are unset); `ValidationError` when one is bad.

    A rating bound filters on human ratings; a comment filter matches any feedback's comment; `failed=1`
    keeps sessions with a failed call, `failed=0` those without.
    """
    given = {k: v.strip() for k, v in params.items() if v.strip()}
    rating = "min_rating" in given or "max_rating" in given
    page_no = max(1, int(given["page"])) if given.get("page", "").isdigit() else 1
    failed = given.get("failed")
    return SessionQuery.model_validate(
        {
            "state": given.get("state"),
            "scenario_contains": given.get("scenario"),
            "text": given.get("q"),
            "outcome": given.get("outcome"),
            "failed_calls": None if failed is None else failed not in ("0", "false", "no"),
            "error_code": given.get("error"),
            "policy_version": given.get("policy"),
            "stage": given.get("stage"),
            "min_reward": given.get("min_reward"),
            "max_reward": given.get("max_reward"),
            "reward_ruleset": given.get("reward_version"),
            "min_duration_ms": given.get("min_ms"),
            "max_duration_ms": given.get("max_ms"),
            "tool_called": given.get("tool"),
            "tool_share": given.get("tool_share"),
            "feedback_type": FeedbackType.HUMAN_RATING if rating else None,
            "min_score": given.get("min_rating"),
            "max_score": given.get("max_rating"),
            "comment_contains": given.get("comment"),
            "order_by": given.get("order", "created_at"),
            "descending": given.get("desc", "1") == "1",
            "limit": page_size,
            "offset": (page_no - 1) * page_size,
        }
    )


@dataclass(frozen=True, slots=True)
class Listed:
    """One row of the list: the session's summary and what the list's columns add to it."""

    row: SessionRow
    outcome: str
    """`solved`, `failed` or `unjudged` (the latest task verdict)."""
    failed_calls: int
    errors: tuple[str, ...]
    duration_ms: float | None
    policy_version: int | None
    stage: str | None
    reward: float | None
    reward_ruleset: str | None

    @property
    def status(self) -> str:
        """The state, with the verdict of a judged session: `finished · failed`, never a plain finished."""
        state = self.row.state.value
        return state if self.outcome == "unjudged" else f"{state} · {self.outcome}"


def listed(store: SessionStore, rows: list[SessionRow], ruleset: str | None = None) -> list[Listed]:
    """The page's rows with their columns, read in three statements for the whole page."""
    ids = [r.session_id for r in rows]
    if not ids:
        return []
    marks = ",".join("?" * len(ids))
    facts = {
        str(f["session_id"]): f
        for f in store.sql(
            "SELECT session_id, outcome, failed_calls, duration_ms, policy_version, stage"
            f" FROM session_facts WHERE session_id IN ({marks})",
            tuple(ids),
        )
    }
    errors: dict[str, list[str]] = {}
    for e in store.sql(
        f"SELECT session_id, code FROM session_errors WHERE session_id IN ({marks}) ORDER BY code", tuple(ids)
    ):
        errors.setdefault(str(e["session_id"]), []).append(str(e["code"]))
    rewards = _latest_rewards(store, ids, ruleset)
    return [_listed(r, facts.get(r.session_id, {}), errors, rewards) for r in rows]


def _listed(
    row: SessionRow, fact: dict[str, Any], errors: dict[str, list[str]], rewards: dict[str, tuple[float, str]]
) -> Listed:
    verdict = fact.get("outcome")
    reward = rewards.get(row.session_id)
    return Listed(
        row=row,
        outcome="unjudged" if verdict is None else ("solved" if int(verdict) else "failed"),
        failed_calls=int(fact.get("failed_calls") or 0),
        errors=tuple(errors.get(row.session_id, ())),
        duration_ms=None if fact.get("duration_ms") is None else float(fact["duration_ms"]),
        policy_version=None if fact.get("policy_version") is None else int(fact["policy_version"]),
        stage=None if fact.get("stage") is None else str(fact["stage"]),
        reward=None if reward is None else reward[0],
        reward_ruleset=None if reward is None else reward[1],
    )


def _latest_rewards(store: SessionStore, ids: list[str], ruleset: str | None) -> dict[str, tuple[float, str]]:
    """Each session's latest reward (of `ruleset` when given): its session reward and ruleset version."""
    marks = ",".join("?" * len(ids))
    only = "" if ruleset is None else " AND ruleset_version = ?"
    rows = store.sql(
        "SELECT session_id, version, ruleset_version, vector FROM rewards"
        f" WHERE session_id IN ({marks}){only}",
        (*ids, *(() if ruleset is None else (ruleset,))),
    )
    latest: dict[str, dict[str, Any]] = {}
    for r in rows:
        sid = str(r["session_id"])
        if sid not in latest or int(r["version"]) > int(latest[sid]["version"]):
            latest[sid] = r
    out = {}
    for sid, r in latest.items():
        total = orjson.loads(str(r["vector"])).get("session_reward")
        if isinstance(total, int | float):
            out[sid] = (float(total), str(r["ruleset_version"]))
    return out


def as_json(item: Listed) -> dict[str, Any]:
    """One listed row as the list's JSON API answers it."""
    row = item.row
    return {
        "session_id": row.session_id,
        "state": row.state.value,
        "outcome": item.outcome,
        "stage": item.stage,
        "scenario": row.scenario,
        "user_query": row.user_query,
        "failed_calls": item.failed_calls,
        "errors": list(item.errors),
        "reward": item.reward,
        "reward_ruleset": item.reward_ruleset,
        "duration_ms": item.duration_ms,
        "policy_version": item.policy_version,
        "n_feedback": row.n_feedback,
        "created_at": row.created_at.isoformat(),
    }


def rulesets(store: SessionStore) -> list[str]:
    """The ruleset versions rewards were saved under, for the form's choice."""
    return [str(r["v"]) for r in store.sql("SELECT DISTINCT ruleset_version AS v FROM rewards ORDER BY 1")]
