"""A run as it stands, and its live stream: status (running, finished, paused by a gate or guard, failed,
stopped), start time, duration, ETA of the current stage and a headline metric; the run page follows the
run's new metrics records over server-sent events, as the session list follows its counts.

The status comes from the run's `status.json` (`sessionrl.train.status`); a run from before it existed
reads as finished once it has an evaluation. The ETA extrapolates the current stage's pace over the steps
its config plans for it (`planned_steps`), so it covers that stage alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from sessionrl.train.status import RunStatus, read_status
from sessionrl.ui.curves import INDEX_FIELDS, number
from sessionrl.ui.runs import EVAL_STAGE, Run, read_run, records_from, run_names

PAUSE_STAGES = frozenset({"paused", "collapse"})
"""Metrics records that say the run was paused: auto-pause, and the collapse guard's rollback."""
PLANNED: dict[str, tuple[str, ...]] = {
    "sft": ("sft", "trainer", "steps"),
    "rl": ("rl", "iterations"),
    "reflection": ("reflection", "trainer", "steps"),
    "dpo": ("dpo", "trainer", "steps"),
}
"""Where a config says how many steps a stage of an LLM run takes."""
HEADLINE = ("success", "completion", "reward", "loss")
"""Words of the metric names a run's headline prefers, in this order."""


@dataclass(frozen=True, slots=True)
class Summary:
    """A run's status line."""

    status: str
    reason: str | None
    started_at: float | None
    duration_s: float | None
    stage: str | None
    done: int | None
    planned: int | None
    eta_s: float | None
    headline: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def planned_steps(config: Mapping[str, Any]) -> dict[str, int]:
    """How many steps each stage of the run's config plans (structured runs: imitation epochs and the
    trainer's iterations)."""
    paths = dict(PLANNED)
    trainer = str(config.get("trainer", ""))
    if trainer in ("ppo", "aaac"):
        paths |= {
            "imitation": (trainer, "imitation", "epochs"),
            trainer: (trainer, "trainer", "run", "iterations"),
        }
    out = {}
    for stage, path in paths.items():
        node: Any = config
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        if isinstance(node, int) and not isinstance(node, bool) and node > 0:
            out[stage] = node
    return out


def summary(
    folder: Path, config: Mapping[str, Any], found: Sequence[Mapping[str, Any]], now: float
) -> Summary:
    """The status line of the run in `folder` whose config and records are given, at time `now`."""
    times = [t for r in found if (t := number(r.get("time"))) is not None]
    record = read_status(folder)
    pause = next((r for r in reversed(found) if r.get("stage") in PAUSE_STAGES), None)
    if record is not None:
        status, reason = record.status.value, record.error
        started: float | None = record.started_at
        ended = record.ended_at if record.status is not RunStatus.RUNNING else now
        if record.status is RunStatus.PAUSED and record.stage == "stopped":
            reason = "the imitation policy did not clear the gate: RL did not start"
    else:  # a run from before status.json: known from its records alone
        status = "finished" if any(r.get("stage") == EVAL_STAGE for r in found) else "unknown"
        started, ended, reason = (min(times), max(times), None) if times else (None, None, None)
    if pause is not None and status in ("finished", "paused"):
        status, reason = (
            "paused",
            str(pause.get("message") or pause.get("reason") or pause.get("metric") or ""),
        )
    stage, done, planned, eta = progress(config, found) if status == "running" else (None, None, None, None)
    duration = ended - started if started is not None and ended is not None else None
    return Summary(status, reason, started, duration, stage, done, planned, eta, headline(found))


def progress(
    config: Mapping[str, Any], found: Sequence[Mapping[str, Any]]
) -> tuple[str | None, int | None, int | None, float | None]:
    """The stage a running run is in, the steps it did and plans, and the seconds its pace leaves."""
    curves = [r for r in found if r.get("stage") != EVAL_STAGE and number(r.get("step")) is not None]
    if not curves:
        return None, None, None, None
    stage = str(curves[-1]["stage"])
    mine = [r for r in curves if r.get("stage") == stage]
    steps = {int(number(r["step"]) or 0) for r in mine}
    done = max(steps) + 1
    planned = planned_steps(config).get(stage)
    times = [t for r in mine if (t := number(r.get("time"))) is not None]
    if planned is None or len(times) < 2 or done < 2:
        return stage, done, planned, None
    pace = (max(times) - min(times)) / (done - 1)
    return stage, done, planned, max(0.0, pace * (planned - done))


def headline(found: Sequence[Mapping[str, Any]]) -> str | None:
    """One figure that says how the run does: the last evaluation's success (or task completion, as
    structured runs report it), else the latest record's first metric named like a `HEADLINE` word."""
    for record in reversed(found):
        if record.get("stage") != EVAL_STAGE:
            continue
        for name in ("success", "completion"):
            value = number(record.get(name))
            if value is not None:
                return f"{record.get('label', '')} {name} {value:.3f}"
    for record in reversed(found):
        for word in HEADLINE:
            for name, raw in record.items():
                value = number(raw)
                if word in name and value is not None and name not in INDEX_FIELDS:
                    return f"{record.get('stage')} {name} {value:.3g}"
    return None


async def run_events(
    folder: Path, config: Mapping[str, Any], offset: int, lasting: float, gone: Any
) -> AsyncIterator[bytes]:
    """Server-sent events of a run: `records` (the new whole lines of its metrics, the event id the
    offset after them, so a reconnecting browser resumes there), `status` when its status line changes,
    and `reset` when the metrics file was rewritten shorter (a resumed run rewinds it: reload).
    `gone` is an awaitable factory saying the client left."""
    yield b"retry: 1000\n\n"
    last: dict[str, Any] | None = None
    found: list[dict[str, Any]] = []
    read = 0  # how far `found` (every record, for the status line) has read; `offset`: what was sent
    until = time.monotonic() + lasting
    while time.monotonic() < until and not await gone():
        size = (folder / "metrics.jsonl").stat().st_size if (folder / "metrics.jsonl").is_file() else 0
        if size < max(offset, read):
            yield b"event: reset\ndata: {}\n\n"
            return
        new, offset, _ = await asyncio.to_thread(records_from, folder, offset)
        if new:
            yield b"event: records\nid: %d\ndata: " % offset + orjson.dumps(new) + b"\n\n"
        more, read, _ = await asyncio.to_thread(records_from, folder, read)
        found += more
        now = summary(folder, config, found, time.time()).as_dict()
        if now != last:
            yield b"event: status\ndata: " + orjson.dumps(now) + b"\n\n"
            last = now
        await asyncio.sleep(1.0)


def utc(at: float | None) -> str:
    """A `time.time()` as the pages print it.

    >>> utc(0.0), utc(None)
    ('1970-01-01 00:00:00 UTC', '—')
    """
    return "—" if at is None else datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


Seen = dict[str, tuple[tuple[int, ...], Run]]
"""Runs read by the list stream, by name, with the stat of their files when read."""


def summaries(runs_dir: Path, now: float, seen: Seen) -> dict[str, dict[str, Any]]:
    """The status line of every run under `runs_dir`, by name (the runs list's live updates); a run whose
    files have not changed since `seen` holds it is not read again."""
    out = {}
    for name in run_names(runs_dir):
        folder = runs_dir / name
        stamp = tuple(
            x for f in ("metrics.jsonl", "config.yaml") if (folder / f).is_file() for x in _stat(folder / f)
        )
        run = seen[name][1] if name in seen and seen[name][0] == stamp else read_run(runs_dir, name)
        if run is not None:
            seen[name] = (stamp, run)
            out[name] = summary(folder, run.config, run.records, now).as_dict()
    return out


def _stat(path: Path) -> tuple[int, int]:
    found = path.stat()
    return found.st_mtime_ns, found.st_size


async def list_events(runs_dir: Path, lasting: float, gone: Any) -> AsyncIterator[bytes]:
    """Server-sent events of the runs list: `runs` (every run's status line, by name) when any changes."""
    yield b"retry: 2000\n\n"
    last: dict[str, Any] | None = None
    seen: Seen = {}
    until = time.monotonic() + lasting
    while time.monotonic() < until and not await gone():
        now = await asyncio.to_thread(summaries, runs_dir, time.time(), seen)
        if now != last:
            yield b"event: runs\ndata: " + orjson.dumps(now) + b"\n\n"
            last = now
        await asyncio.sleep(2.0)
