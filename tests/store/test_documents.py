"""Shard documents: the incremental encoder writes exactly what encoding the whole shard writes."""

from __future__ import annotations

from typing import Any

import pytest

from sessionrl.session import Session, ToolCall, ToolCallRecorded, apply
from sessionrl.store.documents import SHARDS, ShardEncoder
from sessionrl.store.synthetic import session_events


def full(session: Session, shard: str) -> str:
    return session.model_dump_json(include=SHARDS[shard])


def executing(seed: int) -> Session:
    """A generated session as it stood after its last tool call (still taking calls)."""
    events = session_events(seed=seed, index=0)
    last = max(i for i, e in enumerate(events) if isinstance(e, ToolCallRecorded))
    session: Session | None = None
    for event in events[: last + 1]:
        session = apply(session, event)
    assert session is not None
    return session


@pytest.mark.parametrize("capacity", [0, 1, 16])
def test_every_shard_of_every_view_encodes_as_the_whole_shard_does(capacity: int) -> None:
    encoder = ShardEncoder(capacity)
    logs = [session_events(seed=3, index=i) for i in range(4)]
    views: list[Session | None] = [None] * len(logs)
    # interleave the sessions, so a small encoder forgets lists between two writes of one session
    for step in range(max(len(log) for log in logs)):
        for i, log in enumerate(logs):
            if step < len(log):
                views[i] = session = apply(views[i], log[step])
                for shard in SHARDS:
                    assert encoder.encode(session, shard) == full(session, shard)


def test_a_recorded_call_that_replaces_one_reencodes_from_there() -> None:
    encoder = ShardEncoder(8)
    session = executing(seed=5)
    assert len(session.tool_calls) >= 2
    encoder.encode(session, "execution")
    first = session.tool_calls[0]
    retried = first.model_copy(update={"attempt": first.attempt + 1, "output": {"retried": True}})
    session = apply(session, ToolCallRecorded(call=retried))
    assert encoder.encode(session, "execution") == full(session, "execution")


def test_only_calls_added_since_the_last_write_are_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    session = executing(seed=7)
    encoder = ShardEncoder(8)
    encoder.encode(session, "execution")

    encoded: list[Any] = []
    original = ToolCall.__pydantic_serializer__

    class Counting:
        def to_json(self, value: Any) -> bytes:
            encoded.append(value)
            return original.to_json(value)

    monkeypatch.setattr(ToolCall, "__pydantic_serializer__", Counting())
    call = session.tool_calls[-1].model_copy(update={"call_id": "c_new"})
    session = apply(session, ToolCallRecorded(call=call))
    document = encoder.encode(session, "execution")
    monkeypatch.undo()
    assert encoded == [call]
    assert document == full(session, "execution")
