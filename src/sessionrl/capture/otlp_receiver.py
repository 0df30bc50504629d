"""The OTLP receiver's memory: sessions being assembled from spans that arrive over many requests.

Every request's spans are written to the store before the request is answered (one transaction), as
LLM and tool call events whose ids derive from the span ids: a span sent again is stored once. One
exception: a session opens with the request it answers (`user_query`, which cannot change later), so
spans that come before any span telling it (a tool span before the first LLM span, say) are held in
memory until one does, or the root comes, or the session is finished; a crash in between loses them. What is
kept in memory is only what decides when a session is done: which spans and parents it has seen, its
root span, and when its last span came. A session is finished once its root span has come, every span
it has seen has its parent, and no span came for `TracesConfig.root_grace_s`; or after
`TracesConfig.idle_finish_s` without a new span (then what was missing is written into the session's
metadata as `otlp_warnings`).

A span that comes again after its session was finished is a duplicate like any other (stored once,
answered as accepted); a new call span is refused (the answer's partial success counts it and says
why), since a finished session takes no new calls, while late evaluation results are still stored as
feedback. After a restart, `adopt` takes up the sessions of foreign traces left open, which then finish
when idle like the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from sessionrl.capture.otlp import Decoded
from sessionrl.capture.otlp_assembly import (
    MAPPING_ERRORS,
    closing,
    group_keys,
    opening,
    ordered,
    session_id_of,
    span_events,
    warnings_patch,
)
from sessionrl.capture.otlp_config import TracesConfig
from sessionrl.capture.otlp_map import user_query
from sessionrl.capture.otlp_spans import Span
from sessionrl.errors import InvalidEvent, NotFound, SessionRLError
from sessionrl.session.events import Event, FeedbackAdded, PlanSet, SessionCreated
from sessionrl.session.lifecycle import ACTIVE
from sessionrl.session.model import Session
from sessionrl.store import SessionStore
from sessionrl.store.writes import Write

ROOT_ENDED = "root span ended"
log = logging.getLogger("sessionrl.capture.otlp")


def _tells_request(span: Span) -> bool:
    """Whether a span says what the session answers (a root span counts: it is all there will be)."""
    if span.parent_span_id is None:
        return True
    try:
        return user_query(span) is not None
    except MAPPING_ERRORS:
        return False


@dataclass
class _Group:
    """A session being assembled."""

    key: str
    session_id: str
    span_ids: set[str] = field(default_factory=set)
    parents: set[str] = field(default_factory=set)
    traces: set[str] = field(default_factory=set)
    root: Span | None = None
    last_seen: float = 0.0
    deferred: list[Event] = field(default_factory=list)
    waiting: list[Span] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What went wrong while assembling, written into the session's metadata when it is finished."""
    """Spans held until one tells the session's request (the session opens with it), or the finish."""
    opened: bool = False
    closed: bool = False

    def saw(self, span: Span) -> None:
        self.span_ids.add(span.span_id)
        self.traces.add(span.trace_id)
        if span.parent_span_id is None:
            self.root = self.root or span
        else:
            self.parents.add(span.parent_span_id)

    def complete(self) -> bool:
        """Its root has come and no span waits for its parent."""
        return self.root is not None and self.parents <= self.span_ids

    def missing(self) -> list[str]:
        absent = sorted(self.parents - self.span_ids)
        return [f"no span {p} came, though spans name it as their parent" for p in absent]


@dataclass
class _Batch:
    """The writes of one request, each with the group it is for and how many spans it stands for."""

    writes: list[Write] = field(default_factory=list)
    owners: list[tuple[_Group, Event, int]] = field(default_factory=list)

    def add(self, group: _Group, event: Event, *, spans: int) -> None:
        self.writes.append((group.session_id, event, None))
        self.owners.append((group, event, spans))


@dataclass
class Ingested:
    """What one request did: spans stored, spans refused (and why), sessions finished."""

    accepted: int = 0
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)

    def refuse(self, count: int, reason: str) -> None:
        self.rejected += count
        if len(self.reasons) < 10:
            self.reasons.append(reason)


class TraceReceiver:
    """Assembles sessions from OTLP spans into `store`. Thread-safe (one request at a time)."""

    def __init__(
        self, store: SessionStore, config: TracesConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}
        self._traces: dict[str, str] = {}

    @property
    def open_sessions(self) -> int:
        return len(self._groups)

    def adopt(self) -> int:
        """Take up the sessions an earlier run left open (those from foreign traces, whose metadata names
        their group), so that they too finish when idle; return how many."""
        rows = self.store.sql(
            "SELECT session_id FROM session_head WHERE state IN ('created', 'planning', 'executing')"
            " AND session_id LIKE 'otel-%'"
        )
        with self._lock:
            for row in rows:
                key = self.store.get(row["session_id"]).metadata.get("otlp_group")
                if isinstance(key, str) and key not in self._groups:
                    self._groups[key] = _Group(key, row["session_id"], last_seen=self._clock(), opened=True)
        return len(self._groups)

    def ingest(self, decoded: Decoded) -> Ingested:
        """Store a request's spans; finish the sessions they complete."""
        done = Ingested()
        for where, rule in decoded.problems:
            done.refuse(1, f"{where}: {rule}")
        with self._lock:
            by_key: dict[str, list[Span]] = defaultdict(list)
            keys = group_keys(decoded.spans, self.config.group_by, self._traces)
            for span, key in zip(decoded.spans, keys, strict=True):
                by_key[key].append(span)
            batch = _Batch()
            for key, spans in by_key.items():
                self._stage(key, spans, batch, done)
            self._write(batch, done)
            if self.config.root_grace_s == 0:
                ended = [(g, ROOT_ENDED) for g in self._groups.values() if g.complete() and not g.closed]
                self._close(ended, done)
            for key in [k for k, g in self._groups.items() if g.closed]:
                self._forget(key)
        return done

    def sweep(self) -> list[str]:
        """Finish the sessions whose root came `root_grace_s` ago with nothing after it, and those no span
        came for in `idle_finish_s`; return their ids."""
        done = Ingested()
        grace, idle = self.config.root_grace_s, self.config.idle_finish_s
        with self._lock:
            now = self._clock()
            ending: list[tuple[_Group, str]] = []
            for group in self._groups.values():
                quiet = now - group.last_seen
                if group.complete() and quiet >= grace:
                    ending.append((group, ROOT_ENDED))
                elif quiet >= idle:
                    ending.append((group, f"no span came for {idle:g} s"))
            self._close(ending, done)
            for group, _ in ending:
                self._forget(group.key)
        return done.finished

    def _stage(self, key: str, spans: list[Span], batch: _Batch, done: Ingested) -> None:
        group = self._groups.get(key) or self._start(key)
        for span in spans:
            group.saw(span)
        group.last_seen = self._clock()
        done.accepted += len(spans)
        if not group.opened:
            group.waiting += spans
            if not any(_tells_request(s) for s in group.waiting):
                return  # the session opens with its request, which a later span will tell
            spans, group.waiting = group.waiting, []
            try:
                self._open(group, spans, batch)
            except MAPPING_ERRORS as exc:
                done.accepted -= len(spans)
                done.refuse(len(spans), f"session {group.session_id!r} cannot be opened: {exc}")
                group.closed = True  # forgotten after this request; its spans may come again
                return
        for span, why in self._add(group, spans, batch):
            done.accepted -= 1
            done.refuse(1, f"span {span.span_id} ({span.name}): {why}")

    def _start(self, key: str) -> _Group:
        group = _Group(key, session_id_of(key), last_seen=self._clock())
        self._groups[key] = group
        try:
            stored = self.store.get(group.session_id)
        except NotFound:
            return group
        group.opened, group.closed = True, stored.state not in ACTIVE
        return group

    def _open(self, group: _Group, spans: list[Span], batch: _Batch) -> None:
        batch.add(group, opening(group.session_id, spans, group.key), spans=0)
        group.opened = True

    def _add(self, group: _Group, spans: list[Span], batch: _Batch) -> list[tuple[Span, str]]:
        """A group's spans as events: calls in session order, then the feedback on them. Returns the
        spans that could not be mapped (unexpected values), with why."""
        feedback: list[Event] = []
        known = {s.span_id: s for s in spans}
        failed: list[tuple[Span, str]] = []
        for span in ordered(spans):
            try:
                calls, notes = span_events(span, group.key, known)
            except MAPPING_ERRORS as exc:
                failed.append((span, str(exc)))
                continue
            for event in calls:
                batch.add(group, event, spans=int(not isinstance(event, PlanSet)))
            feedback += notes
        for event in feedback:
            batch.add(group, event, spans=0)
        return failed

    def _write(self, batch: _Batch, done: Ingested) -> None:
        """Append in one transaction; feedback whose anchor has not come yet waits for the finish."""
        results = self.store.append_batch(batch.writes)
        for (group, event, spans), result in zip(batch.owners, results, strict=True):
            if not isinstance(result, SessionRLError):
                continue
            if isinstance(event, SessionCreated):
                raise result
            if isinstance(event, FeedbackAdded) and isinstance(result, InvalidEvent):
                group.deferred.append(event)
            else:
                done.accepted -= spans
                done.refuse(spans, f"{event.event_id}: {result}")

    def _close(self, ending: list[tuple[_Group, str]], done: Ingested) -> None:
        """Finish sessions (each with its reason), all in one transaction, then note what was missing."""
        if not ending:
            return
        waiting = _Batch()
        for group, _ in ending:
            if not group.opened and not self._open_late(group, waiting):
                group.closed = True  # nothing to finish: it is forgotten with the others
        ending = [(group, reason) for group, reason in ending if not group.closed]
        if waiting.writes:
            self._write(waiting, done)
        batch = _Batch()
        latest: dict[str, Session] = {}
        for group, reason in ending:
            if group.root is None:
                group.notes.append("no root span came: finished when spans stopped coming")
            group.notes += group.missing()
            latest[group.session_id] = session = self.store.get(group.session_id)
            try:
                events = closing(session, group.root, group.key, reason)
            except MAPPING_ERRORS as exc:  # the root's own fields are unusable: finish without them
                group.notes.append(f"root span {group.root and group.root.span_id}: {exc}")
                events = closing(session, None, group.key, reason)
            for event in events + group.deferred:
                batch.add(group, event, spans=0)
        results = self.store.append_batch(batch.writes)
        for (group, event, _), result in zip(batch.owners, results, strict=True):
            if isinstance(result, SessionRLError):
                group.notes.append(f"event {event.event_id} left out: {result}")
            else:
                latest[group.session_id] = result
        notes = [
            (g.session_id, e, None)
            for g, _ in ending
            for e in warnings_patch(latest[g.session_id], g.notes, g.key)
        ]
        for result in self.store.append_batch(notes) if notes else ():
            if isinstance(result, SessionRLError):
                raise result
        for group, _ in ending:
            group.closed = True
            done.finished.append(group.session_id)

    def _open_late(self, group: _Group, batch: _Batch) -> bool:
        """Open a session at its finish, with what its spans held (no span told its request)."""
        group.notes.append("no span told the request the session answers: its user_query is empty")
        try:
            self._open(group, group.waiting, batch)
        except MAPPING_ERRORS as exc:
            log.warning("trace session %s dropped: it cannot be opened: %s", group.session_id, exc)
            return False
        failed = self._add(group, group.waiting, batch)
        group.notes += [f"span {span.span_id} ({span.name}) left out: {why}" for span, why in failed]
        return True

    def _forget(self, key: str) -> None:
        group = self._groups.pop(key)
        for trace in group.traces:
            if self._traces.get(trace) == key:
                del self._traces[trace]
