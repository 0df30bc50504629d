"""`sessionrl loop CONFIG`: the continuous cycle of feed, re-scoring, attribution, retraining and canary."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from sessionrl.cli.sessions import open_store, out, reporting


def loop_command(
    config: Annotated[
        Path, typer.Argument(help="Loop config (YAML): db, ops, train, thresholds, interval_s.")
    ],
    cycles: Annotated[
        int | None, typer.Option(help="Stop after this many cycles (default: run until stopped).")
    ] = None,
) -> None:
    """Follow the store's change feed, re-score, attribute failures, retrain past a threshold, gate, and
    start a canary; check running canaries (see `sessionrl.ops.loop`). Each cycle prints its decision."""
    from sessionrl.ops.loop import Loop, LoopConfig  # the training stack loads only when a loop runs

    with reporting():
        loop_config = LoopConfig.load(config)
        with open_store(loop_config.db) as store:
            loop = Loop(loop_config, store)
            done = 0
            while cycles is None or done < cycles:
                if done:
                    time.sleep(loop_config.interval_s)
                report = loop.run_cycle()
                done += 1
                shares = ", ".join(f"{c} {s:.1%}" for c, s in report.shares.items()) or "none attributed"
                detail = ", ".join(
                    f"{k} {v}" for k, v in report.detail.items() if isinstance(v, int | float | str)
                )
                out.print(
                    f"cycle {done}: {report.changed} changed, {report.rescored} re-scored,"
                    f" failures: {shares}; {report.decision}" + (f" ({detail})" if detail else "")
                )
                if cycles is None or done < cycles:
                    out.print(f"next cycle in {loop_config.interval_s:g} s (Ctrl-C stops)")
