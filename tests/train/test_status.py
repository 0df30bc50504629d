"""status.json: running while the block runs, then finished, paused or failed; a refused start keeps the
folder's earlier status; a running run whose process is gone reads as stopped."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from sessionrl.train.status import RunStatus, StatusRecord, read_status, recording, write_status


def status_of(folder: Path) -> StatusRecord:
    record = read_status(folder)
    assert record is not None, f"no status.json in {folder}"
    return record


def test_a_run_is_running_then_finished_with_its_stage(tmp_path: Path) -> None:
    with recording(tmp_path) as outcome:
        now = status_of(tmp_path)
        assert (now.status, now.pid, now.ended_at) == (RunStatus.RUNNING, os.getpid(), None)
        outcome["stage"] = "rl"
    done = status_of(tmp_path)
    assert (done.status, done.stage) == (RunStatus.FINISHED, "rl")
    assert (done.ended_at or 0.0) >= done.started_at


def fail_writing(folder: Path) -> None:
    with recording(folder):
        (folder / "metrics.jsonl").write_text("{}\n")
        raise RuntimeError("out of memory")


def test_a_gate_stop_is_paused_and_an_error_failed(tmp_path: Path) -> None:
    with recording(tmp_path) as outcome:
        outcome["stage"] = "stopped"
    assert status_of(tmp_path).status is RunStatus.PAUSED
    with pytest.raises(RuntimeError):
        fail_writing(tmp_path / "b")
    failed = status_of(tmp_path / "b")
    assert (failed.status, failed.error) == (RunStatus.FAILED, "RuntimeError: out of memory")


def test_a_start_refused_before_writing_leaves_the_earlier_status(tmp_path: Path) -> None:
    with recording(tmp_path):
        (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(FileExistsError), recording(tmp_path):
        raise FileExistsError("already holds a run")
    assert status_of(tmp_path).status is RunStatus.FINISHED


def test_a_running_run_whose_process_is_gone_reads_as_stopped(tmp_path: Path) -> None:
    with recording(tmp_path):
        live = status_of(tmp_path)
    pid = 2**22 + 17  # above Linux's largest pid (2**22): no such process
    write_status(tmp_path, dataclasses.replace(live, status=RunStatus.RUNNING, pid=pid))
    assert status_of(tmp_path).status is RunStatus.STOPPED
    (tmp_path / "status.json").write_text("{not json")
    assert read_status(tmp_path) is None
