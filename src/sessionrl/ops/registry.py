"""The policy registry: versions of a policy with their lineage, evaluation and stage, in the session store.

A policy (a name such as `orders`) has versions 1, 2, ... Each version points at its artifact (an exported
policy folder), says what made it (`Lineage`: the run, the data cursor, the reward rule version) and how it
scored (`evaluation`), and sits in one stage of one table:

    candidate ─▶ canary ─▶ production ─▶ retired
        └──────────────────▲    └─────────▲  (promote straight to production; rollback restores a retired one)

At most one version of a policy is in production and at most one is a canary (with the share of sessions it
serves). Every change is one store transaction that also appends a line to the operations log (`ops_log`),
so the log says who moved what, when and why. Global switches (the strategy mode) live in `ops_settings`.

>>> from sessionrl.store import SessionStore
>>> with SessionStore.open("sqlite://") as store:
...     registry = PolicyRegistry(store)
...     v1 = registry.register("orders", "runs/a/sft_policy")
...     v1 = registry.promote("orders", v1.version, Stage.PRODUCTION, reason="first")
...     (v1.version, v1.stage.value, registry.production("orders").version)
(1, 'production', 1)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sessionrl.errors import InvalidEvent, InvalidTransition, NotFound, SessionRLError
from sessionrl.session.model import utcnow
from sessionrl.store import SessionStore
from sessionrl.store.backend import Connection
from sessionrl.store.documents import iso


class Stage(StrEnum):
    """Where a policy version is in its life."""

    CANDIDATE = "candidate"
    CANARY = "canary"
    PRODUCTION = "production"
    RETIRED = "retired"


TRANSITIONS: dict[Stage, frozenset[Stage]] = {
    Stage.CANDIDATE: frozenset({Stage.CANARY, Stage.PRODUCTION, Stage.RETIRED}),
    Stage.CANARY: frozenset({Stage.PRODUCTION, Stage.RETIRED}),
    Stage.PRODUCTION: frozenset({Stage.RETIRED}),
    Stage.RETIRED: frozenset({Stage.PRODUCTION}),
}
"""Allowed stage changes: `TRANSITIONS[current]` holds every stage a version may move to in one step."""


class InvalidStage(InvalidTransition):
    """A policy version may not move to the asked stage from the one it is in (an HTTP 409)."""

    def __init__(self, policy: str, version: int, stage: Stage, target: Stage) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[stage])) or "none"
        SessionRLError.__init__(
            self, f"policy {policy!r} v{version} is {stage}: it cannot move to {target} (allowed: {allowed})"
        )
        self.session_id = f"{policy}@{version}"
        self.state = str(stage)
        self.event = str(target)


class Lineage(BaseModel):
    """What made a version: the run folder, the change-feed cursor its data reached, the reward rules."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_dir: str | None = Field(default=None, description="The training run's folder.")
    data_cursor: int | None = Field(default=None, description="Change-feed cursor the training data reached.")
    ruleset_version: str | None = Field(default=None, description="Reward rule-set version of its data.")
    parent: int | None = Field(default=None, description="The version it was trained from.")
    trainer: str | None = Field(default=None, description="sft, dpo, grpo, ... (or how else it was made).")
    note: str | None = Field(default=None, description="Free text: why this version exists.")


class PolicyVersion(BaseModel):
    """One registered version of a policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str
    version: int
    kind: str = Field(description="llm (a causal LM or adapter folder) or structured.")
    stage: Stage
    artifact: str = Field(description="Where the exported policy lives (a folder or URI).")
    share: float = Field(ge=0.0, le=1.0, description="Share of sessions a canary serves (0 otherwise).")
    lineage: Lineage
    evaluation: dict[str, Any]
    created_at: datetime
    updated_at: datetime


class LogEntry(BaseModel):
    """One line of the operations log: a stage change, a routing or canary decision, a switch, an alert."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int
    at: datetime
    kind: str
    policy: str | None
    version: int | None
    detail: dict[str, Any]


POLICY_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
"""What a policy's name may be (it appears in session tags as `<policy>@v<version>`)."""

_IDEMPOTENT = "idempotency:"
"""Prefix of the `ops_settings` rows remembering the answers to requests with an idempotency key."""

_COLUMNS = "policy, version, kind, stage, artifact, share, lineage, evaluation, created_at, updated_at"


def _version(row: tuple[Any, ...]) -> PolicyVersion:
    policy, version, kind, stage, artifact, share, lineage, evaluation, created, updated = row
    return PolicyVersion(
        policy=policy,
        version=int(version),
        kind=kind,
        stage=Stage(stage),
        artifact=artifact,
        share=float(share),
        lineage=Lineage.model_validate_json(lineage),
        evaluation=json.loads(evaluation),
        created_at=datetime.fromisoformat(created),
        updated_at=datetime.fromisoformat(updated),
    )


def _json(value: Mapping[str, Any]) -> str:
    """JSON text of a mapping from a caller (the standard encoder: integers of any size; others as text)."""
    return json.dumps(dict(value), default=str, ensure_ascii=False)


def log_line(
    conn: Connection, kind: str, policy: str | None, version: int | None, detail: Mapping[str, Any]
) -> None:
    """Append one line to the operations log, inside the caller's transaction."""
    conn.execute(
        "INSERT INTO ops_log (at, kind, policy, version, detail) VALUES (?, ?, ?, ?, ?)",
        (iso(utcnow()), kind, policy, version, _json(detail)),
    )


ArtifactCheck = Callable[[PolicyVersion], object]
"""Loads a version's artifact (what serving it will do), raising when it cannot; what it returns is
dropped. `Operations` passes its policy loader; `sessionrl policies` the Hugging Face one."""


class UnusableArtifact(InvalidEvent):
    """A version's artifact is missing or does not load: registering or promoting it is refused (422)."""

    def __init__(self, version: PolicyVersion, problem: str) -> None:
        super().__init__("artifact", f"{version.artifact!r} cannot serve {version.policy}: {problem}")


def check_artifact(check: ArtifactCheck, version: PolicyVersion) -> None:
    """Run `check` on `version`; whatever it raises (a loader raises anything from `FileNotFoundError` to a
    framework's own errors) becomes `UnusableArtifact` naming the artifact and the reason."""
    try:
        check(version)
    except Exception as exc:  # the loader is pluggable: any failure to load means it cannot serve
        raise UnusableArtifact(version, f"{type(exc).__name__}: {exc}") from exc


class PolicyRegistry:
    """Policy versions, their stages and the operations log, on a session store's database.

    With a `check`, a version is registered, and promoted to canary or production, only when its artifact
    loads (`UnusableArtifact` otherwise): an artifact removed after registering is caught at promotion,
    not by every request the version would serve. The check runs outside the store's transaction.
    """

    def __init__(self, store: SessionStore, *, check: ArtifactCheck | None = None) -> None:
        self.store = store
        self.check = check
        self._db = store.backend

    # reads

    def versions(self, policy: str | None = None) -> list[PolicyVersion]:
        """Every version (of `policy`, or of all policies), by policy then version."""
        where, params = ("WHERE policy = ?", (policy,)) if policy is not None else ("", ())
        with self._db.snapshot() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM policy_versions {where} ORDER BY policy, version", params
            ).fetchall()
        return [_version(tuple(r)) for r in rows]

    def get(self, policy: str, version: int) -> PolicyVersion:
        """One version; `NotFound` when it is not registered."""
        with self._db.snapshot() as conn:
            return self._get(conn, policy, version)

    def production(self, policy: str) -> PolicyVersion | None:
        """The version in production, if any."""
        return self._in_stage(policy, Stage.PRODUCTION)

    def canary(self, policy: str) -> PolicyVersion | None:
        """The canary version, if any."""
        return self._in_stage(policy, Stage.CANARY)

    def _in_stage(self, policy: str, stage: Stage) -> PolicyVersion | None:
        with self._db.snapshot() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM policy_versions WHERE policy = ? AND stage = ?",
                (policy, stage.value),
            ).fetchone()
        return None if row is None else _version(tuple(row))

    def log(self, *, kind: str | None = None, policy: str | None = None, after: int = 0) -> list[LogEntry]:
        """Lines of the operations log after id `after` (of one kind, about one policy), oldest first."""
        conds, params = ["id > ?"], list[Any]([after])
        for column, value in (("kind", kind), ("policy", policy)):
            if value is not None:
                conds.append(f"{column} = ?")
                params.append(value)
        with self._db.snapshot() as conn:
            rows = conn.execute(
                f"SELECT id, at, kind, policy, version, detail FROM ops_log WHERE {' AND '.join(conds)}"
                " ORDER BY id",
                tuple(params),
            ).fetchall()
        return [
            LogEntry(
                id=int(i), at=datetime.fromisoformat(at), kind=k, policy=p, version=v, detail=json.loads(d)
            )
            for i, at, k, p, v, d in rows
        ]

    # writes

    def register(
        self,
        policy: str,
        artifact: str,
        *,
        kind: str = "llm",
        lineage: Lineage | None = None,
        evaluation: Mapping[str, Any] | None = None,
        key: str | None = None,
    ) -> PolicyVersion:
        """Add the next version of `policy` as a candidate, and log it. A repeat of `key` returns the
        version the first call registered."""
        if not POLICY_NAME.match(policy):
            raise InvalidEvent("policy", f"must match {POLICY_NAME.pattern}, got {policy[:40]!r}")
        lineage = lineage or Lineage()
        now = iso(utcnow())
        if self.check is not None:
            proposed = PolicyVersion(
                policy=policy,
                version=0,
                kind=kind,
                stage=Stage.CANDIDATE,
                artifact=artifact,
                share=0.0,
                lineage=lineage,
                evaluation=dict(evaluation or {}),
                created_at=datetime.fromisoformat(now),
                updated_at=datetime.fromisoformat(now),
            )
            check_artifact(self.check, proposed)
        with self._write(policy, key) as (conn, done):
            if done is not None:
                return done
            row = conn.execute(
                "SELECT COALESCE(MAX(version), 0) + 1 FROM policy_versions WHERE policy = ?", (policy,)
            ).fetchone()
            version = int(row[0])
            conn.execute(
                f"INSERT INTO policy_versions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    policy,
                    version,
                    kind,
                    Stage.CANDIDATE.value,
                    artifact,
                    0.0,
                    lineage.model_dump_json(),
                    _json(evaluation or {}),
                    now,
                    now,
                ),
            )
            log_line(conn, "registered", policy, version, {"artifact": artifact, **lineage.model_dump()})
            return self._answer(conn, key, self._get(conn, policy, version))

    def promote(
        self,
        policy: str,
        version: int,
        to: Stage,
        *,
        share: float | None = None,
        reason: str = "",
        key: str | None = None,
    ) -> PolicyVersion:
        """Move a version to `to` (canary with `share`, or production); the version it replaces there (the
        previous canary, or the production version) is retired. Logged with `reason`. A repeat of `key`
        returns the first call's answer and moves nothing."""
        if to not in (Stage.CANARY, Stage.PRODUCTION):
            raise InvalidEvent("to", f"promote moves a version to canary or production, not {to}")
        if to is Stage.CANARY and not (share is not None and 0.0 < share <= 1.0):
            raise InvalidEvent("share", f"a canary needs a share in (0, 1], got {share}")
        if self.check is not None:
            check_artifact(self.check, self.get(policy, version))
        with self._write(policy, key) as (conn, done):
            if done is not None:
                return done
            current = self._get(conn, policy, version)
            if to not in TRANSITIONS[current.stage] or current.stage is Stage.RETIRED:
                raise InvalidStage(policy, version, current.stage, to)
            for other in self._stage_rows(conn, policy, to):
                self._move(conn, other, Stage.RETIRED, 0.0, f"replaced by v{version}")
            if to is Stage.PRODUCTION and current.stage is not Stage.CANARY:
                for canary in self._stage_rows(conn, policy, Stage.CANARY):
                    self._move(conn, canary, Stage.RETIRED, 0.0, f"v{version} went to production")
            return self._answer(conn, key, self._move(conn, current, to, share or 0.0, reason))

    def retire(self, policy: str, version: int, *, reason: str = "") -> PolicyVersion:
        """Retire a version (a candidate nobody wants, or a canary that is stopped)."""
        with self._write(policy) as (conn, _):
            current = self._get(conn, policy, version)
            if Stage.RETIRED not in TRANSITIONS[current.stage]:
                raise InvalidStage(policy, version, current.stage, Stage.RETIRED)
            return self._move(conn, current, Stage.RETIRED, 0.0, reason)

    def rollback(self, policy: str, *, reason: str, key: str | None = None) -> PolicyVersion:
        """Undo the last release of `policy`: stop its canary when there is one (routing to it stops);
        otherwise retire production and bring back the version that was in production before it.
        Returns the version serving production afterwards (`NotFound` when none can). A repeat of `key`
        returns the first call's answer and undoes nothing more."""
        with self._write(policy, key) as (conn, done):
            if done is not None:
                return done
            canaries = self._stage_rows(conn, policy, Stage.CANARY)
            production = self._stage_rows(conn, policy, Stage.PRODUCTION)
            if not production:
                raise NotFound("production version of policy", policy)
            if canaries:
                self._move(conn, canaries[0], Stage.RETIRED, 0.0, reason, kind="rolled_back")
                return self._answer(conn, key, production[0])
            earlier = self._previous_production(conn, policy, production[0].version)
            if earlier is None:
                raise NotFound("earlier production version of policy", policy)
            self._move(conn, production[0], Stage.RETIRED, 0.0, reason, kind="rolled_back")
            restored = self._move(conn, earlier, Stage.PRODUCTION, 0.0, f"restored: {reason}")
            return self._answer(conn, key, restored)

    def set_evaluation(self, policy: str, version: int, evaluation: Mapping[str, Any]) -> PolicyVersion:
        """Replace a version's evaluation (after a gate or an A/B analysis)."""
        with self._write(policy) as (conn, _):
            self._get(conn, policy, version)
            conn.execute(
                "UPDATE policy_versions SET evaluation = ?, updated_at = ? WHERE policy = ? AND version = ?",
                (_json(evaluation), iso(utcnow()), policy, version),
            )
            log_line(conn, "evaluated", policy, version, dict(evaluation))
            return self._get(conn, policy, version)

    def record(
        self, kind: str, detail: Mapping[str, Any], *, policy: str | None = None, version: int | None = None
    ) -> None:
        """Append a decision (a canary check, a loop step, an alert) to the operations log."""
        with self._db.atomic() as conn:
            log_line(conn, kind, policy, version, detail)

    def setting(self, key: str) -> str | None:
        """A global switch's value (`ops_settings`), or None when it was never set."""
        with self._db.snapshot() as conn:
            row = conn.execute("SELECT value FROM ops_settings WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_setting(
        self, key: str, value: str, *, detail: Mapping[str, Any] | None = None, log: bool = True
    ) -> None:
        """Set a global switch and (unless `log` is false, for bookkeeping such as a cursor) log it."""
        with self._db.atomic() as conn:
            conn.execute(
                "INSERT INTO ops_settings (key, value, updated_at) VALUES (?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                (key, value, iso(utcnow())),
            )
            if log:
                log_line(conn, "setting", None, None, {"key": key, "value": value, **(detail or {})})

    # plumbing

    @contextmanager
    def _write(
        self, policy: str, key: str | None = None
    ) -> Iterator[tuple[Connection, PolicyVersion | None]]:
        """A write transaction holding the policy's lock (other processes changing it wait), with the
        answer already given to a request of idempotency `key` (None when it is new, or no key)."""
        with self._db.atomic() as conn:
            self._db.serialise(conn, [f"policy:{policy}"])
            done = None
            if key is not None:
                row = conn.execute(
                    "SELECT value FROM ops_settings WHERE key = ?", (_IDEMPOTENT + key,)
                ).fetchone()
                done = None if row is None else PolicyVersion.model_validate_json(row[0])
            yield conn, done

    def _answer(self, conn: Connection, key: str | None, answer: PolicyVersion) -> PolicyVersion:
        """Remember the answer to a request of idempotency `key` (in the caller's transaction)."""
        if key is not None:
            conn.execute(
                "INSERT INTO ops_settings (key, value, updated_at) VALUES (?, ?, ?)",
                (_IDEMPOTENT + key, answer.model_dump_json(), iso(utcnow())),
            )
        return answer

    def _get(self, conn: Connection, policy: str, version: int) -> PolicyVersion:
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM policy_versions WHERE policy = ? AND version = ?", (policy, version)
        ).fetchone()
        if row is None:
            raise NotFound("policy version", f"{policy}@{version}")
        return _version(tuple(row))

    def _stage_rows(self, conn: Connection, policy: str, stage: Stage) -> list[PolicyVersion]:
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM policy_versions WHERE policy = ? AND stage = ? ORDER BY version",
            (policy, stage.value),
        ).fetchall()
        return [_version(tuple(r)) for r in rows]

    def _previous_production(self, conn: Connection, policy: str, current: int) -> PolicyVersion | None:
        """The latest retired version that once served production (from the log), other than `current`."""
        rows = conn.execute(
            "SELECT version, detail FROM ops_log WHERE policy = ? AND kind = 'stage' ORDER BY id DESC",
            (policy,),
        ).fetchall()
        for version, detail in rows:
            if int(version) != current and json.loads(detail).get("to") == Stage.PRODUCTION.value:
                found = self._get(conn, policy, int(version))
                if found.stage is Stage.RETIRED:
                    return found
        return None

    def _move(
        self,
        conn: Connection,
        current: PolicyVersion,
        to: Stage,
        share: float,
        reason: str,
        *,
        kind: str = "stage",
    ) -> PolicyVersion:
        conn.execute(
            "UPDATE policy_versions SET stage = ?, share = ?, updated_at = ?"
            " WHERE policy = ? AND version = ?",
            (to.value, share, iso(utcnow()), current.policy, current.version),
        )
        detail = {"from": current.stage.value, "to": to.value, "share": share, "reason": reason}
        log_line(conn, kind, current.policy, current.version, detail)
        if kind != "stage":
            log_line(conn, "stage", current.policy, current.version, detail)
        return self._get(conn, current.policy, current.version)
