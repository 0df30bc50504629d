"""One progress bar for every long loop (episode batches, training stages).

On a terminal it is a rich bar (description, bar, done/total, elapsed time, time left, a free info text).
Anywhere else (a pipe, a log file, CI) a redrawn bar would be noise or nothing at all, so the same calls
print plain lines instead, `<description> <done>/<total> <elapsed>s (~<left>s left) <info>`: one each time
another tenth of the total is done (and at least every `every_s` seconds), and one at the end. The time
left is the pace so far applied to what remains.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class Bar:
    """A running progress bar: call `advance` as work gets done."""

    def __init__(
        self,
        console: Console,
        description: str,
        total: int,
        *,
        completed: int = 0,
        live: Progress | None = None,
        every_s: float = 30.0,
    ) -> None:
        self.console, self.description, self.total = console, description, total
        self.completed = completed
        self.every_s = every_s
        self._live = live
        self._task = live.add_task(description, total=total, completed=completed, info="") if live else None
        self._started = time.monotonic()
        self._printed_at = self._started
        self._printed = self._first = completed

    def advance(self, n: int = 1, info: str = "") -> None:
        """`n` more units done; `info` is shown beside the count (a loss, a success rate)."""
        self.completed += n
        if self._live is not None and self._task is not None:
            self._live.update(self._task, advance=n, info=info)
            return
        tenth = max(1, self.total // 10)
        now = time.monotonic()
        if self.completed // tenth > self._printed // tenth or now - self._printed_at >= self.every_s:
            self.line(info)

    def line(self, info: str = "") -> None:
        """Print the plain progress line now."""
        elapsed = time.monotonic() - self._started
        done, left = self.completed - self._first, self.total - self.completed
        pace = f" (~{elapsed / done * left:.0f}s left)" if done > 0 and left > 0 else ""
        text = f"{self.description} {self.completed}/{self.total} {elapsed:.0f}s{pace} {info}".rstrip()
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        self._printed, self._printed_at = self.completed, time.monotonic()

    def finish(self) -> None:
        """Print the last plain line, unless the bar is live or the last line already says it all."""
        if self._live is None and self.completed != self._printed:
            self.line()


@contextmanager
def progress(
    console: Console, description: str, total: int, *, completed: int = 0, enabled: bool = True
) -> Iterator[Bar]:
    """A progress bar of `total` units on `console` for the block (nothing shown when not `enabled`)."""
    if not enabled or not console.is_terminal:
        bar = Bar(console if enabled else Console(quiet=True), description, total, completed=completed)
        yield bar
        bar.finish()
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns, console=console, transient=False) as live:
        yield Bar(console, description, total, completed=completed, live=live)
