"""The learning curve in the terminal: a sparkline and a small table of what each RL iteration did."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], low: float = 0.0, high: float = 1.0) -> str:
    """One block character per value, scaled between `low` and `high`.

    >>> sparkline([0.0, 0.5, 1.0])
    '▁▅█'
    """
    span = (high - low) or 1.0
    return "".join(BARS[round(min(max((v - low) / span, 0.0), 1.0) * (len(BARS) - 1))] for v in values)


def curve_table(curve: Sequence[Mapping[str, Any]], title: str = "GRPO learning curve") -> Table:
    """One row per iteration (training-rollout success, loss, KL, sessions, seconds), the sparkline below."""
    table = Table(title=title)
    for name in ("iteration", "success", "pg loss", "approx KL", "sessions", "stale", "seconds"):
        table.add_column(name, justify="right")
    for record in curve:
        table.add_row(
            str(record["iteration"]),
            f"{record['success']:.3f}",
            _num(record.get("pg_loss")),
            _num(record.get("approx_kl")),
            str(record.get("sessions", "")),
            str(record.get("stale", "")),
            f"{record.get('seconds', 0.0):.1f}",
        )
    table.caption = "success per iteration  " + sparkline([float(r["success"]) for r in curve])
    return table


def _num(value: Any) -> str:
    return "-" if value is None else f"{float(value):.4f}"


__all__ = ["curve_table", "sparkline"]
