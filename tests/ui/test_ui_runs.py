"""Run folders as the dashboard reads them: curves per stage and metric, evaluation rows, failures by policy,
paired tests, a run's status line and ETA, the live stream of its records, and runs compared."""

from __future__ import annotations

import asyncio
import os
import re
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from ui_support import READER, TOKENS, tiny_run

from sessionrl.ops.registry import Lineage, PolicyVersion, Stage
from sessionrl.service import parse_tokens
from sessionrl.session import FeedbackAdded
from sessionrl.session.model import Feedback, FeedbackType, SessionCreate
from sessionrl.store import SessionStore
from sessionrl.train.status import RunStatus, StatusRecord, write_status
from sessionrl.ui import UIConfig, compare, create_ui_app, curves, live, policies, runs, training


def append(folder: Path, *records: dict[str, Any]) -> None:
    with (folder / "metrics.jsonl").open("ab") as file:
        file.write(b"".join(orjson.dumps(r) + b"\n" for r in records))


def test_a_run_folder_reads_as_stages_curves_and_evaluations(tmp_path: Path) -> None:
    tiny_run(tmp_path / "r1")
    (tmp_path / "r1" / "metrics.jsonl").open("a").write('{"stage": "rl", "step": 9, "rew')  # half-written
    (tmp_path / "not-a-run").mkdir()
    assert runs.run_names(tmp_path) == ["r1"]
    run = runs.read_run(tmp_path, "r1")
    assert run is not None
    assert run.stages == {"sft": 6, "rl": 5, "eval": 2}
    loss = run.metrics[0]
    assert (loss.stage, loss.name, loss.steps[:2], loss.values[:2]) == ("sft", "loss", [0.0, 1.0], [2.0, 1.0])
    assert loss.elapsed[:2] == [0.0, 1.0]  # seconds since the run's first record
    assert [(m.stage, m.name) for m in run.metrics[1:]] == [("rl", "reward"), ("rl", "success"), ("rl", "kl")]
    assert [e["label"] for e in run.evaluations] == ["sft", "rl"]
    # each evaluated policy's failures apart, never pooled
    assert runs.failures(run.evaluations) == {
        "sft": {"wrong_order": 1, "no_answer": 1},
        "rl": {"wrong_order": 2, "no_answer": 1},
    }
    assert runs.thresholds(run.config, {"tcsr": 0.9, "spt": 8.0}) == {"tcsr": 0.85, "spt": 8.0}
    assert runs.read_run(tmp_path, "missing") is None


def test_records_are_read_from_an_offset_and_a_half_written_line_waits(tmp_path: Path) -> None:
    append(tmp_path, {"stage": "rl", "step": 0, "loss": 1.0})
    first, offset, _ = runs.records_from(tmp_path)
    assert [r["loss"] for r in first] == [1.0]
    (tmp_path / "metrics.jsonl").open("a").write('{"stage": "rl", "step": 1, "loss": 0.5')
    assert runs.records_from(tmp_path, offset) == ([], offset, 0)  # the line is not whole yet
    (tmp_path / "metrics.jsonl").open("a").write('}\nnot json\n["a list"]\n')
    later, end, unreadable = runs.records_from(tmp_path, offset)
    assert ([r["loss"] for r in later], unreadable) == ([0.5], 2)  # two whole lines are no record: counted
    assert end == (tmp_path / "metrics.jsonl").stat().st_size


def test_metrics_say_which_are_shown_first_and_their_units() -> None:
    records = [
        {"stage": "rl", "step": s, "time": 100.0 + 10 * s, "loss": 1.0 - s / 10, "approx_kl": 0.01,
         "tokens": 20_000 + s, "rollout_s": 3.5, "rewards_s": 1.0, "iteration": s, "note": "x"}
        for s in range(3)
    ] + [{"stage": "rl", "step": 2, "time": 130.0, "loss": 0.7}]  # fmt: skip
    found = {m.name: m for m in curves.metrics(records)}
    assert set(found) == {"loss", "approx_kl", "tokens", "rollout_s", "rewards_s"}  # no counters, no text
    assert {n for n, m in found.items() if m.main} == {"loss", "approx_kl"}
    assert (found["tokens"].unit, found["rewards_s"].unit, found["loss"].unit) == ("tokens", "s", "")
    assert found["loss"].values == [1.0, 0.9, 0.7]  # step 2 logged twice keeps its last value
    assert found["loss"].elapsed == [0.0, 10.0, 30.0]
    assert curves.latest(found["loss"]) == {"step": 2.0, "value": 0.7, "min": 0.7, "max": 1.0}


def test_the_evaluation_charts_draw_one_series_per_run_and_policy(tmp_path: Path) -> None:
    tiny_run(tmp_path / "a")
    tiny_run(tmp_path / "b")
    charts = runs.evaluation_charts(runs.evaluation_history(tmp_path), {"tcsr": 0.85})
    tcsr = next(c for c in charts if c["metric"] == "tcsr")
    labels = sorted(s["label"] for s in tcsr["series"])
    assert labels == ["a / rl", "a / sft", "b / rl", "b / sft", "threshold"]
    assert all(len(s["values"]) == (2 if s["label"] == "threshold" else 1) for s in tcsr["series"])
    cu = next(c for c in charts if c["metric"] == "cu")
    assert cu["series"] == []  # nobody measured it, and it has no threshold here


def test_pairs_without_a_task_in_common_are_set_apart() -> None:
    solved = {
        "gate": {"d1": True, "d2": False},
        "sft": {"t1": True, "t2": False, "t3": False},
        "rl": {"t1": True, "t2": True, "t3": True},
    }
    tested, apart = runs.paired(solved)
    assert [(p.first, p.second) for p in apart] == [("gate", "sft"), ("gate", "rl")]
    ((pair),) = tested
    assert (pair.first, pair.second, pair.tasks) == ("sft", "rl", 3)
    assert (pair.test.first_only, pair.test.second_only, pair.test.p_value) == (0, 2, 0.5)  # 2 * 1/4


def rl_run(folder: Path, steps: int, iterations: int = 10) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(f"trainer: grpo\nrl:\n  iterations: {iterations}\n")
    append(
        folder,
        *({"stage": "rl", "step": s, "time": 100.0 + 10 * s, "success": 0.1 * s} for s in range(steps)),
    )


def test_a_running_run_shows_its_progress_and_eta(tmp_path: Path) -> None:
    rl_run(tmp_path, steps=4)
    write_status(tmp_path, StatusRecord(RunStatus.RUNNING, 95.0, os.getpid(), socket.gethostname()))
    found = runs.records(tmp_path)
    line = live.summary(tmp_path, {"trainer": "grpo", "rl": {"iterations": 10}}, found, now=140.0)
    # 4 of 10 iterations in 30 s (10 s each): 6 left, 60 s
    assert (line.status, line.stage, line.done, line.planned, line.eta_s) == ("running", "rl", 4, 10, 60.0)
    assert (line.started_at, line.duration_s) == (95.0, 45.0)
    assert line.headline == "rl success 0.3"


def test_a_collapse_pauses_the_run_and_an_old_run_reads_as_finished(tmp_path: Path) -> None:
    rl_run(tmp_path / "old", steps=2)
    append(tmp_path / "old", {"stage": "eval", "step": 2, "time": 200.0, "label": "rl", "success": 0.25})
    old = live.summary(tmp_path / "old", {}, runs.records(tmp_path / "old"), now=500.0)
    assert (old.status, old.started_at, old.duration_s, old.headline) == (
        "finished",
        100.0,
        100.0,
        "rl success 0.250",
    )
    append(
        tmp_path / "old", {"stage": "collapse", "step": 2, "time": 210.0, "message": "RL stopped: TCSR fell"}
    )
    paused = live.summary(tmp_path / "old", {}, runs.records(tmp_path / "old"), now=500.0)
    assert (paused.status, paused.reason) == ("paused", "RL stopped: TCSR fell")


def test_the_live_stream_sends_new_records_and_the_status(tmp_path: Path) -> None:
    rl_run(tmp_path, steps=2)
    offset = runs.records_from(tmp_path).offset
    rl_run(tmp_path, steps=0)
    append(tmp_path, {"stage": "rl", "step": 2, "time": 120.0, "success": 0.5})

    async def gone() -> bool:
        return False

    async def first_events(n: int) -> list[bytes]:
        stream = live.run_events(tmp_path, {}, offset, lasting=5.0, gone=gone)
        return [await anext(stream) for _ in range(n)]

    retry, records, status = asyncio.run(first_events(3))
    assert retry == b"retry: 1000\n\n"
    head, data = records.rstrip(b"\n").split(b"\ndata: ")
    assert head == b"event: records\nid: %d" % (tmp_path / "metrics.jsonl").stat().st_size
    assert [r["success"] for r in orjson.loads(data)] == [0.5]
    assert status.startswith(b"event: status\ndata: ")
    assert orjson.loads(status.split(b"data: ")[1])["headline"] == "rl success 0.5"


def test_config_differences_leave_out_the_run_folder() -> None:
    a = {"run_dir": "runs/a", "seed": 0, "rl": {"iterations": 20, "trainer": {"lr": 1e-4}}}
    b = {"run_dir": "runs/b", "seed": 0, "rl": {"iterations": 40, "trainer": {"lr": 1e-4, "beta": 0.1}}}
    assert compare.config_diff([a, b]) == [("rl.iterations", ["20", "40"]), ("rl.trainer.beta", ["—", "0.1"])]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with SessionStore.open(f"sqlite:///{tmp_path / 's.db'}"):
        pass
    tiny_run(tmp_path / "runs" / "r1")
    rl_run(tmp_path / "runs" / "r2", steps=3)
    config = UIConfig(runs_dir=tmp_path / "runs", live_for_s=0.5)
    app = create_ui_app(f"sqlite:///{tmp_path / 's.db'}", config, parse_tokens(TOKENS))
    with TestClient(app, follow_redirects=False) as opened:
        opened.post("/ui/login", data={"token": READER})
        yield opened


def test_the_runs_list_and_the_compare_page(client: TestClient) -> None:
    listing = client.get("/ui/runs").text
    assert re.search(r'data-run="r1".*?status-finished.*?rl success 0\.750', listing, re.S)
    assert re.search(r'data-run="r2".*?status-unknown', listing, re.S)
    page = client.get("/ui/compare?run=r1&run=r2&run=nope").text
    assert "No such run: nope." in page
    assert re.findall(r'<th class="num">(r\d / \w+)</th>', page) == ["r1 / sft", "r1 / rl"]
    assert "<td>rl.iterations</td><td>—</td><td>10</td>" in page
    success = [
        m for m in re.findall(r'class="run-chart-data">(.*?)</script>', page) if '"metric": "success"' in m
    ]
    assert [s["label"] for s in orjson.loads(success[0])["series"]] == ["r1", "r2"]
    assert "Tick two or more runs" in client.get("/ui/compare?run=r1").text


def test_the_run_page_and_its_stream(client: TestClient, tmp_path: Path) -> None:
    (tmp_path / "runs" / "r1" / "metrics.jsonl").open("a").write("not json\n")
    page = client.get("/ui/runs/r1").text
    assert "1 line(s) of metrics.jsonl are no JSON record" in page
    assert 'data-run-live="/ui/runs/r1/live?after=' in page
    assert page.count('class="run-chart"') == 4  # sft loss, rl reward, success and kl
    with client.stream("GET", "/ui/runs/r1/live") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        body = b"".join(stream.iter_bytes())
    assert b"event: records" in body
    assert b"event: status" in body
    assert client.get("/ui/runs/nope/live").status_code == 404


def test_the_run_page_links_its_sessions_by_stage(client: TestClient, tmp_path: Path) -> None:
    with SessionStore.open(f"sqlite:///{tmp_path / 'runs' / 'r1' / 'sessions.db'}") as store:
        for session_id, stage, score in (
            ("eval-a", "eval", 0.0),
            ("eval-b", "eval", 1.0),
            ("rl-0", "rl", None),
        ):
            meta = {"stage": stage, "label": "rl", "task_id": session_id}
            store.create(SessionCreate(user_query="q", session_id=session_id, metadata=meta))
            if score is not None:
                verdict = Feedback(type=FeedbackType.TASK_OUTCOME, score=score)
                store.append(session_id, FeedbackAdded(feedback=verdict))
        assert runs.stage_sessions(store) == {"eval": (2, 1), "rl": (1, 0)}
    page = client.get("/ui/runs/r1").text
    links = re.findall(r'href="(/ui/sessions\?run=r1[^"]*)"[^>]*>([^<]*)</a>', page)
    assert links == [
        ("/ui/sessions?run=r1&amp;stage=eval", "eval (2)"),
        ("/ui/sessions?run=r1&amp;stage=eval&amp;outcome=failed", "1 failed"),
        ("/ui/sessions?run=r1&amp;stage=rl", "rl (1)"),
    ]


def test_the_headline_reads_structured_runs_too() -> None:
    rounds = [{"stage": "ppo", "step": 4, "time": 1.0, "policy_loss": -0.02, "train_completion": 0.52}]
    assert live.headline(rounds) == "ppo train_completion 0.52"
    done = [*rounds, {"stage": "eval", "step": 0, "time": 2.0, "label": "ppo", "completion": 0.5}]
    assert live.headline(done) == "ppo completion 0.500"
    assert live.headline([{"stage": "sft", "step": 0, "loss": 2.5}]) == "sft loss 2.5"


def test_the_list_stream_sends_every_runs_status_line(tmp_path: Path) -> None:
    tiny_run(tmp_path / "r1")
    rl_run(tmp_path / "r2", steps=2)

    async def gone() -> bool:
        return False

    async def first_events() -> list[bytes]:
        stream = live.list_events(tmp_path, lasting=5.0, gone=gone)
        return [await anext(stream) for _ in range(2)]

    retry, listed = asyncio.run(first_events())
    assert retry == b"retry: 2000\n\n"
    assert listed.startswith(b"event: runs\ndata: ")
    lines = orjson.loads(listed.split(b"data: ")[1])
    assert {name: line["status"] for name, line in lines.items()} == {"r1": "finished", "r2": "unknown"}


def test_policy_versions_are_compared_through_the_runs_that_trained_them(tmp_path: Path) -> None:
    tiny_run(tmp_path / "r1")
    at = datetime(2026, 1, 1, tzinfo=UTC)

    def version(n: int, run_dir: str | None) -> PolicyVersion:
        return PolicyVersion(
            policy="orders", version=n, kind="llm", stage=Stage.CANDIDATE, artifact=f"{run_dir}/rl_policy",
            share=0.0, lineage=Lineage(run_dir=run_dir), evaluation={}, created_at=at, updated_at=at,
        )  # fmt: skip

    versions = [version(1, str(tmp_path / "r1")), version(2, "/elsewhere/gone"), version(3, None)]
    assert policies.version_runs(versions, tmp_path) == {("orders", 1): "r1"}


def test_runs_past_the_compare_limit_are_named(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training, "MAX_COMPARED", 1)
    page = client.get("/ui/compare?run=r1&run=r2").text
    assert "At most 1 runs are compared at once; left out: r2." in page
