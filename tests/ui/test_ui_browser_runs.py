"""The run pages in a real headless Chromium: read a loss value from its chart, compare two runs, and watch a
running run update without a reload. Screenshots go under each test's temporary folder."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from playwright.sync_api import expect
from ui_support import READER, TOKENS, World, log_in, serving, tiny_run

from sessionrl.service import parse_tokens
from sessionrl.train.status import RunStatus, StatusRecord, write_status
from sessionrl.ui import UIConfig, create_ui_app


def append(folder: Path, *records: dict[str, Any]) -> None:
    with (folder / "metrics.jsonl").open("ab") as file:
        file.write(b"".join(orjson.dumps(r) + b"\n" for r in records))


def rl_record(step: int, start: float = 1.7e9) -> dict[str, Any]:
    # is_weight moves by one float32 ulp, as an importance weight does
    return {"stage": "rl", "step": step, "time": start + 10 * step, "success": 0.1 * step,
            "loss": 1.0 / (step + 1), "tokens": 12_000 + 2_000 * step,
            "is_weight": 1.0 - 6e-8 * (step % 2)}  # fmt: skip


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two finished runs that differ in their RL iterations, and a running one."""
    root = tmp_path_factory.mktemp("runs")
    tiny_run(root / "tiny-a")
    shutil.copytree(root / "tiny-a", root / "tiny-b")
    config = root / "tiny-b" / "config.yaml"
    config.write_text(config.read_text() + "rl:\n  iterations: 9\n")
    running = root / "running"
    running.mkdir()
    (running / "config.yaml").write_text("trainer: grpo\nrl:\n  iterations: 10\n")
    append(running, *(rl_record(s) for s in range(3)))
    write_status(running, StatusRecord(RunStatus.RUNNING, 1.7e9 - 5, os.getpid(), socket.gethostname()))
    return root


@pytest.fixture(scope="module")
def board(world: World, runs_dir: Path) -> Iterator[str]:
    config = UIConfig(runs_dir=runs_dir, live_for_s=5.0)
    yield from serving(create_ui_app(f"sqlite:///{world.db}", config, parse_tokens(TOKENS)))


def test_read_a_loss_value_from_its_chart(page: Any, board: str, tmp_path: Path) -> None:
    log_in(page, board, READER, "/ui/runs")
    page.click("text=tiny-a")
    page.wait_for_url("**/ui/runs/tiny-a")
    shown = page.locator(".run-chart:visible")
    titles = shown.locator(".u-title").all_text_contents()
    assert titles == ["sft · loss", "rl · reward", "rl · success", "rl · kl"]
    loss = page.locator('.run-chart[data-stage="sft"][data-metric="loss"]')
    # the table under the chart: the last loss is 2/6 at step 5
    assert float(loss.locator("[data-latest=value]").get_attribute("data-value")) == pytest.approx(2 / 6)
    expect(loss.locator("[data-latest=value]")).to_have_text("0.333")
    expect(loss.locator("[data-latest=step]")).to_have_text("5")
    # the chart itself: the cursor on the first point reads the first loss, 2.0, in the legend
    over = loss.locator(".u-over").bounding_box()
    page.mouse.move(over["x"] + 1, over["y"] + over["height"] / 2)
    expect(loss.locator(".u-legend .u-series").nth(1).locator(".u-value")).to_have_text("2")
    expect(loss.locator(".u-legend .u-series").nth(0).locator(".u-value")).to_have_text("0")
    # smoothing (an EMA debiased at the start) at weight 0.5 makes the last point 0.4402, worked out by hand
    page.locator("input[name=smooth]").fill("0.5")
    over = loss.locator(".u-over").bounding_box()
    page.mouse.move(over["x"] + over["width"] - 1, over["y"] + over["height"] / 2)
    expect(loss.locator(".u-legend .u-series").nth(1).locator(".u-value")).to_have_text("0.44")
    expect(loss.locator(".u-legend .u-series").nth(2).locator(".u-value")).to_have_text("0.333")  # raw, faint
    expect(loss.locator("[data-latest=value]")).to_have_text("0.333")  # the table keeps the raw value
    # the wall-time axis: the last loss was logged 5 s after the run's first record
    page.check("input[name=axis][value=elapsed]")
    page.mouse.move(over["x"] + over["width"] - 1, over["y"] + over["height"] / 2)
    expect(loss.locator(".u-legend .u-series").nth(0).locator(".u-value")).to_have_text("5s")
    rows = page.locator("table.evaluation tbody tr")
    assert rows.locator("td:first-child").all_text_contents() == ["sft", "rl"]
    assert "trainer: grpo" in page.text_content("pre.config")
    # the page also splits failures by policy and sets pairs without a common task apart
    assert page.locator(".failure-groups figure").evaluate_all("fs => fs.map(f => f.dataset.policy)") == [
        "sft",
        "rl",
    ]
    page.screenshot(path=tmp_path / "run.png", full_page=True)

    page.goto(f"{board}/ui/evaluation?label=rl")
    assert page.locator(".run-chart canvas").count() == 5
    assert "tcsr 0.85" in page.text_content("main")
    page.goto(f"{board}/ui/evaluation")
    tcsr = page.locator('.run-chart[data-metric="tcsr"] .u-legend .u-series .u-label')
    assert sorted(tcsr.all_text_contents()) == sorted(
        ["time", "tiny-a / sft", "tiny-a / rl", "tiny-b / sft", "tiny-b / rl", "threshold"]
    )  # one series per run and policy, not one line through all of them
    page.screenshot(path=tmp_path / "evaluation.png", full_page=True)


def test_compare_two_runs(page: Any, board: str, tmp_path: Path) -> None:
    page.set_viewport_size({"width": 1400, "height": 900})
    log_in(page, board, READER, "/ui/runs")
    page.check('input[name=run][value="tiny-a"]')
    page.check('input[name=run][value="tiny-b"]')
    page.click("text=Compare the ticked runs")
    page.wait_for_url("**/ui/compare?run=*")
    first, second = (part.split("=")[1] for part in page.url.split("?")[1].split("&"))
    assert {first, second} == {"tiny-a", "tiny-b"}  # in the list's order (newest first)
    success = page.locator('.run-chart[data-stage="rl"][data-metric="success"] .u-legend .u-label')
    assert success.all_text_contents() == ["step", first, second]
    heads = page.locator("table.compare-evaluation thead th").all_text_contents()
    assert heads == ["metric", f"{first} / sft", f"{first} / rl", f"{second} / sft", f"{second} / rl"]
    iterations = {"tiny-a": "—", "tiny-b": "9"}
    diff = page.locator("table.config-diff tbody td").all_text_contents()
    assert diff == ["rl.iterations", iterations[first], iterations[second]]
    widths = page.locator(".run-chart canvas").evaluate_all(
        "cs => cs.map(c => c.getBoundingClientRect().width)"
    )
    assert len(widths) == 4
    assert min(widths) >= 380  # three charts a row at 1400 px, each wide enough to read
    page.screenshot(path=tmp_path / "compare.png", full_page=True)


def test_watch_a_running_run_update(page: Any, board: str, runs_dir: Path, tmp_path: Path) -> None:
    log_in(page, board, READER, "/ui/runs/running")
    panel = page.locator("[data-run-live]")
    expect(panel.locator("[data-field=status]")).to_have_text("running")
    expect(panel.locator("[data-field=progress]")).to_have_text("rl step 3 of 10")
    success = page.locator('.run-chart[data-metric="success"]')
    expect(success.locator("[data-latest=step]")).to_have_text("2")
    tokens = page.locator('.run-chart[data-metric="tokens"]')
    expect(tokens).to_be_hidden()
    page.check("input[name=more]")
    expect(tokens).to_be_visible()
    expect(tokens.locator("[data-latest=value]")).to_have_text("16k")  # 16,000 tokens, not "0,000"
    # a curve that moves by less than a millionth is drawn flat (uPlot hung spacing its ticks finer)
    expect(page.locator('.run-chart[data-metric="is_weight"] canvas')).to_be_visible()
    page.screenshot(path=tmp_path / "running-before.png", full_page=True)

    append(runs_dir / "running", rl_record(3), rl_record(4))
    expect(success.locator("[data-latest=step]")).to_have_text("4", timeout=15_000)
    expect(success.locator("[data-latest=value]")).to_have_text("0.4")
    expect(tokens.locator("[data-latest=value]")).to_have_text("20k")
    expect(page.locator("[data-live-records]")).to_have_text("2")
    expect(page.locator('ol.stages li[data-stage="rl"]')).to_have_text("rl · 5 records")
    expect(panel.locator("[data-field=progress]")).to_have_text("rl step 5 of 10")
    expect(panel.locator("[data-field=eta]")).to_have_text("50s")  # 10 s an iteration, 5 left
    expect(page.locator("[data-live-note]")).to_be_hidden()
    # a new stage and an evaluation: their chart and table are swapped in without a reload, and the
    # controls keep what was chosen (tokens still shown)
    assert page.locator("table.evaluation").count() == 0
    page.evaluate("window.unreloaded = true")
    append(
        runs_dir / "running",
        {"stage": "dpo", "step": 0, "time": 1.7e9 + 52, "loss": 0.7},
        {"stage": "dpo", "step": 1, "time": 1.7e9 + 53, "loss": 0.6},
        {"stage": "eval", "step": 5, "time": 1.7e9 + 55, "label": "rl", "success": 0.5},
    )
    dpo = page.locator('.run-chart[data-stage="dpo"][data-metric="loss"]')
    expect(dpo).to_be_visible(timeout=15_000)
    expect(dpo.locator("[data-latest=value]")).to_have_text("0.6")
    expect(page.locator("table.evaluation tbody tr td").first).to_have_text("rl", timeout=15_000)
    expect(tokens).to_be_visible()
    expect(page.locator("input[name=more]")).to_be_checked()
    expect(page.locator("[data-live-note]")).to_be_hidden()
    assert page.evaluate("window.unreloaded") is True  # the same page, not a reload
    append(runs_dir / "running", rl_record(5))  # the swapped-in charts follow the live records too
    expect(success.locator("[data-latest=step]")).to_have_text("5", timeout=15_000)

    record = StatusRecord(
        RunStatus.FINISHED, 1.7e9 - 5, os.getpid(), socket.gethostname(), ended_at=1.7e9 + 60
    )
    write_status(runs_dir / "running", record)
    expect(panel.locator("[data-field=status]")).to_have_text("finished", timeout=15_000)
    expect(panel.locator("[data-field=duration]")).to_have_text("1m 05s")
    page.screenshot(path=tmp_path / "running-after.png", full_page=True)

    # the runs list follows every run's status too
    page.goto(f"{board}/ui/runs")
    row = page.locator('tr[data-run="running"]')
    expect(row.locator("[data-field=status]")).to_have_text("finished")
    failed = dataclasses.replace(record, status=RunStatus.FAILED, error="RuntimeError: out of memory")
    write_status(runs_dir / "running", failed)
    expect(row.locator("[data-field=status]")).to_have_text("failed", timeout=15_000)
    expect(row.locator("[data-field=status]")).to_have_attribute("class", "status status-failed")
