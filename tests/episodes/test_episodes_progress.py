"""The one progress bar: a rich bar on a terminal, plain lines anywhere else, nothing when disabled."""

from __future__ import annotations

import importlib
import io

import pytest
from rich.console import Console

from sessionrl.episodes import progress


def plain_console() -> tuple[Console, io.StringIO]:
    sink = io.StringIO()
    return Console(file=sink, force_terminal=False, width=120), sink


def test_off_a_terminal_it_prints_a_line_per_tenth_and_one_at_the_end() -> None:
    console, sink = plain_console()
    with progress(console, "imitation", 25) as bar:
        bar.every_s = 3600.0  # lines by count only
        for step in range(25):
            bar.advance(info=f"loss {1 / (step + 1):.2f}")
    lines = sink.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == [
        f"{n}/25" for n in (2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 25)
    ]
    assert all(line.startswith("imitation ") for line in lines)
    assert lines[0].endswith("loss 0.50")
    assert lines[-1].split()[1:2] == ["25/25"]


def test_a_resumed_bar_counts_from_where_it_stood() -> None:
    console, sink = plain_console()
    with progress(console, "reinforce", 10, completed=7) as bar:
        bar.every_s = 3600.0
        bar.advance()
    assert [line.split()[1] for line in sink.getvalue().splitlines()] == ["8/10"]


def test_a_disabled_bar_prints_nothing() -> None:
    console, sink = plain_console()
    with progress(console, "tasks", 3, enabled=False) as bar:
        for _ in range(3):
            bar.advance()
    assert sink.getvalue() == ""


def test_on_a_terminal_it_draws_a_rich_bar() -> None:
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=True, width=120)
    with progress(console, "demonstrations", 4) as bar:
        for _ in range(4):
            bar.advance(info="ok")
    drawn = sink.getvalue()
    assert "demonstrations" in drawn
    assert "4/4" in drawn
    assert "\x1b[" in drawn  # redrawn in place, not printed line by line


def test_plain_lines_say_how_long_is_left_at_the_pace_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    module = importlib.import_module("sessionrl.episodes.progress")  # not the package's `progress` function
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    console, sink = plain_console()
    with progress(console, "imitation", 4) as bar:
        bar.every_s = 3600.0
        now[0] = 10.0
        bar.advance()
        now[0] = 40.0
        bar.advance()
    first, second = sink.getvalue().splitlines()
    assert first == "imitation 1/4 10s (~30s left)"  # 10 s for one, three to go
    assert second == "imitation 2/4 40s (~40s left)"  # 20 s each so far, two to go
