"""Where a run stands, for whoever watches it: `status.json` in the run folder.

`sessionrl train` writes it when the run starts (`running`, with the start time and the process id) and
rewrites it when the run ends (`finished`, `paused` when the run stopped at a gate or a guard, or `failed`
with the error)::

    {"status": "finished", "started_at": 1796328100.2, "ended_at": 1796333290.8, "pid": 4242,
     "host": "box", "stage": "rl", "error": null}

A run refused before it wrote anything (a folder that already holds a run) leaves the folder's earlier
status as it was. `read_status` tells a `running` run whose process is gone on this host as `stopped`.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
PAUSED_STAGES = frozenset({"paused", "stopped"})
"""Final loop stages (`sessionrl.train.llm.checkpoint.Stage`) of a run stopped at a gate or a guard."""


class RunStatus(StrEnum):
    """A run's state as the dashboard shows it."""

    RUNNING = "running"
    FINISHED = "finished"
    PAUSED = "paused"
    """Stopped early by a gate (imitation below the bar), the collapse guard or auto-pause."""
    FAILED = "failed"
    STOPPED = "stopped"
    """Said `running`, but its process is gone (killed, or the machine restarted)."""


@dataclass(frozen=True, slots=True)
class StatusRecord:
    """The content of `status.json`."""

    status: RunStatus
    started_at: float
    pid: int
    host: str
    ended_at: float | None = None
    stage: str | None = None
    """The loop's final stage, where the trainer has one (`sft`, `rl`, `paused`, `stopped`, ...)."""
    error: str | None = None


def write_status(folder: Path, record: StatusRecord) -> None:
    """Write `record` atomically (a temporary file renamed into place)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STATUS_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(record)), encoding="utf-8")
    os.replace(tmp, folder / STATUS_FILE)


def read_status(folder: Path) -> StatusRecord | None:
    """The run's status, or None when it has no readable `status.json` (runs from before it existed)."""
    try:
        doc: Any = json.loads((folder / STATUS_FILE).read_text(encoding="utf-8"))
        record = StatusRecord(**(doc | {"status": RunStatus(doc["status"])}))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if record.status is RunStatus.RUNNING and not _alive(record):
        return replace(record, status=RunStatus.STOPPED)
    return record


def _alive(record: StatusRecord) -> bool:
    """Whether the run's process still runs (assumed so when it ran on another host)."""
    if record.host != socket.gethostname():
        return True
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def recording(folder: Path) -> Iterator[dict[str, str | None]]:
    """Mark the run in `folder` running for the duration of the block; the caller may put the loop's
    final `stage` in the yielded dict. An exception marks it failed and propagates. Under torchrun only
    rank 0 writes."""
    if os.environ.get("RANK", "0") != "0":
        yield {"stage": None}
        return
    before = (folder / STATUS_FILE).read_bytes() if (folder / STATUS_FILE).is_file() else None
    size = _metrics_size(folder)
    start = StatusRecord(RunStatus.RUNNING, time.time(), os.getpid(), socket.gethostname())
    write_status(folder, start)
    outcome: dict[str, str | None] = {"stage": None}
    try:
        yield outcome
    except BaseException as exc:
        if before is not None and _metrics_size(folder) == size:
            (folder / STATUS_FILE).write_bytes(before)  # refused before writing: the earlier run stands
        else:
            error = f"{type(exc).__name__}: {exc}"[:500]
            status = RunStatus.STOPPED if isinstance(exc, KeyboardInterrupt) else RunStatus.FAILED
            write_status(folder, replace(start, status=status, ended_at=time.time(), error=error))
        raise
    stage = outcome["stage"]
    status = RunStatus.PAUSED if stage in PAUSED_STAGES else RunStatus.FINISHED
    write_status(folder, replace(start, status=status, ended_at=time.time(), stage=stage))


def _metrics_size(folder: Path) -> int:
    path = folder / METRICS_FILE
    return path.stat().st_size if path.is_file() else -1


__all__ = ["STATUS_FILE", "RunStatus", "StatusRecord", "read_status", "recording", "write_status"]
