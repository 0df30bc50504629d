"""How sessions and events are laid out in the hot tables, and read back.

A materialised session is a small head row (ids, state, versions, descriptive fields) plus three shard
rows: `plan` (written once), `execution` (tool calls, LLM calls, final output; written often) and
`feedback` (written rarely, read often). An append rewrites the head and only the shard whose content
changed. Stored documents carry their schema version; `sessionrl.session.schema.load_session` turns any
version into the current view, and `upcast_event` does the same for logged events.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from sessionrl.errors import InvalidEvent
from sessionrl.session.events import EVENT_ADAPTER, Event, invalid_from, parse_event
from sessionrl.session.model import SCHEMA_VERSION, Session, in_utc
from sessionrl.session.schema import load_session, plan_v1_to_v2
from sessionrl.store.backend import Connection

Doc = dict[str, Any]

SHARDS: dict[str, set[str]] = {
    "plan": {"plan"},
    "execution": {"tool_calls", "llm_calls", "final_output"},
    "feedback": {"feedback"},
}
"""The session fields each shard row holds."""

HEAD_FIELDS = {
    *("session_id", "trace_id", "scenario", "tags", "user_id", "user_query", "metadata"),
    *("created_at", "updated_at"),
}
"""Session fields kept in the head row's document (state and versions have columns of their own)."""


def iso(value: str | datetime) -> str:
    """A timestamp as fixed-width UTC text (`2025-03-01T08:00:00.000000Z`), so text order is time order.

    Naive times are taken as UTC, like the canonical encoding does.

    >>> iso("2025-03-01T08:00:00+02:00")
    '2025-03-01T06:00:00.000000Z'
    """
    if isinstance(value, str):
        if len(value) == 27 and value[19] == "." and value[26] == "Z":
            return value
        if len(value) == 20 and value[19] == "Z":
            return value[:19] + ".000000Z"
        value = datetime.fromisoformat(value)
    # isoformat is several times faster than strftime; without a zone it is the same fixed-width text
    return in_utc(value).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def head_row(session: Session) -> tuple[Any, ...]:
    """Values of a `session_head` row, in the column order of `write_session`."""
    v = session.versions
    doc = session.__pydantic_serializer__.to_json(session, include=HEAD_FIELDS).decode()
    return (
        *(session.session_id, session.schema_version, session.state.value, session.state_version),
        *(v.plan, v.execution, v.feedback, doc),
    )


def changed_shards(old: Session | None, new: Session, *, legacy: bool = False) -> list[str]:
    """Shards whose content differs between two successive views of a session.

    `apply` copies a session and replaces only the fields an event changes, so an unchanged shard keeps
    the very same objects; a new session, or one stored under an older schema (`legacy`), writes all.
    """
    if old is None or legacy:
        return list(SHARDS)
    return [
        shard
        for shard, fields in SHARDS.items()
        if any(getattr(old, f) is not getattr(new, f) for f in fields)
    ]


SHARD_FIELDS = {
    shard: tuple(f for f in Session.model_fields if f in fields) for shard, fields in SHARDS.items()
}
"""Each shard's fields in the order the session model declares them (the order its JSON lists them in)."""


class ShardEncoder:
    """Encodes shard documents, re-using the encoded items of lists it encoded before (calls, feedback).

    A step appends one call to the execution shard; encoding the whole shard again made a step cost more
    the longer its session was. Records are frozen, so an item that is the very same object as one encoded
    before encodes the same: only the items after the longest such shared prefix are encoded. The lists
    of the `capacity` sessions written last are remembered. The result is, byte for byte,
    `session.model_dump_json(include=SHARDS[shard])`.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lists: OrderedDict[str, dict[str, tuple[tuple[BaseModel, ...], list[bytes]]]] = OrderedDict()

    def encode(self, session: Session, shard: str) -> str:
        """The document of one shard of `session`."""
        known = self._lists.pop(session.session_id, {})
        parts: list[bytes] = []
        for name in SHARD_FIELDS[shard]:
            value = getattr(session, name)
            if isinstance(value, tuple):
                items = _encoded_items(value, *known.get(name, ((), [])))
                known[name] = (value, items)
                encoded = b"[" + b",".join(items) + b"]"
            else:
                encoded = b"null" if value is None else value.__pydantic_serializer__.to_json(value)
            parts.append(b'"' + name.encode() + b'":' + encoded)
        if self.capacity:
            self._lists[session.session_id] = known
            while len(self._lists) > self.capacity:
                self._lists.popitem(last=False)
        return (b"{" + b",".join(parts) + b"}").decode()


def _encoded_items(
    items: tuple[BaseModel, ...], before: tuple[BaseModel, ...], encoded: list[bytes]
) -> list[bytes]:
    """The encoded `items`, re-using `encoded` (the encoding of `before`) for their shared prefix."""
    shared = 0
    if len(before) <= len(items) and all(map(operator.is_, before, items)):
        shared = len(before)  # the usual case: items were appended
    else:
        while shared < min(len(before), len(items)) and before[shared] is items[shared]:
            shared += 1
    return encoded[:shared] + [item.__pydantic_serializer__.to_json(item) for item in items[shared:]]


def write_session(conn: Connection, session: Session, shards: Iterable[str]) -> None:
    """Upsert the head row and the given shard rows of a session."""
    write_sessions(conn, [(session, shards)], ShardEncoder(0))


def write_sessions(
    conn: Connection, views: Iterable[tuple[Session, Iterable[str]]], encoder: ShardEncoder
) -> None:
    """Upsert the head rows and the given shard rows of many sessions, two statements in all."""
    heads: list[tuple[Any, ...]] = []
    shard_rows: list[tuple[str, str, str]] = []
    for session, shards in views:
        heads.append(head_row(session))
        shard_rows.extend((session.session_id, shard, encoder.encode(session, shard)) for shard in shards)
    conn.executemany(
        "INSERT INTO session_head (session_id, schema_version, state, state_version, plan_version,"
        " execution_version, feedback_version, doc) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (session_id) DO UPDATE SET schema_version = excluded.schema_version,"
        " state = excluded.state, state_version = excluded.state_version,"
        " plan_version = excluded.plan_version, execution_version = excluded.execution_version,"
        " feedback_version = excluded.feedback_version, doc = excluded.doc",
        heads,
    )
    conn.executemany(
        "INSERT INTO session_shard (session_id, shard, doc) VALUES (?, ?, ?)"
        " ON CONFLICT (session_id, shard) DO UPDATE SET doc = excluded.doc",
        shard_rows,
    )


def delete_session(conn: Connection, session_id: str) -> None:
    """Remove a session's materialised rows (the log is left alone)."""
    conn.execute("DELETE FROM session_head WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM session_shard WHERE session_id = ?", (session_id,))


def read_documents(conn: Connection, session_ids: Sequence[str]) -> dict[str, Doc]:
    """The stored documents (in their own schema version) of the sessions that exist, by id."""
    docs: dict[str, Doc] = {}
    for chunk in chunks(session_ids, 500):
        marks = ",".join("?" * len(chunk))
        for sid, version, state, sv, pv, ev, fv, doc in conn.execute(
            "SELECT session_id, schema_version, state, state_version, plan_version, execution_version,"
            f" feedback_version, doc FROM session_head WHERE session_id IN ({marks})",
            chunk,
        ):
            head = orjson.loads(doc)
            head |= {"schema_version": version, "state": state, "state_version": sv}
            head["versions"] = {"plan": pv, "execution": ev, "feedback": fv}
            docs[sid] = head
        for sid, shard_doc in conn.execute(
            f"SELECT session_id, doc FROM session_shard WHERE session_id IN ({marks})", chunk
        ):
            if sid in docs:
                docs[sid].update(orjson.loads(shard_doc))
    return docs


def read_session(conn: Connection, session_id: str) -> tuple[Session, bool] | None:
    """The current view of a stored session and whether its document is of an older schema, or None."""
    return read_sessions(conn, [session_id]).get(session_id)


def read_sessions(conn: Connection, session_ids: Sequence[str]) -> dict[str, tuple[Session, bool]]:
    """Current views of the stored sessions among `session_ids`, each with whether its document is of an
    older schema, by id."""
    return {
        sid: (load_session(doc), doc.get("schema_version") != SCHEMA_VERSION)
        for sid, doc in read_documents(conn, session_ids).items()
    }


def chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    """Consecutive slices of at most `size` items (SQLite bounds the number of parameters)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


# events


def encode_event(event: Event) -> bytes:
    """The JSON stored for an event (its size is what `max_event_bytes` bounds)."""
    return event.__pydantic_serializer__.to_json(event)


def canonical_event(payload: bytes) -> Event:
    """The event exactly as it will read back from the log, so the stored view equals the replayed one."""
    try:
        return EVENT_ADAPTER.validate_json(payload)
    except ValidationError as exc:
        raise invalid_from(exc) from exc


def upcast_v1_event(doc: Doc) -> Doc:
    """A v1 event as v2: plans listed their sub-goals as plain strings."""
    if doc.get("type") == "plan_set" and doc.get("plan") is not None:
        return {**doc, "plan": plan_v1_to_v2(doc["plan"])}
    return doc


EVENT_MIGRATIONS: dict[int, Callable[[Doc], Doc]] = {1: upcast_v1_event}
"""`EVENT_MIGRATIONS[v]` turns an event logged under schema version `v` into one of version `v+1`."""


def decode_event(payload: str | bytes, schema_version: int) -> Event:
    """A logged event as a current `Event`, upcast from the schema version it was written under."""
    if schema_version == SCHEMA_VERSION:
        return canonical_event(payload if isinstance(payload, bytes) else payload.encode())
    if not 1 <= schema_version < SCHEMA_VERSION:
        raise InvalidEvent("schema_version", f"unknown event schema version {schema_version}")
    doc: Doc = orjson.loads(payload)
    for version in range(schema_version, SCHEMA_VERSION):
        doc = EVENT_MIGRATIONS[version](doc)
    return parse_event(doc)
