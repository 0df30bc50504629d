"""bench/engine_memory.py end to end on a tiny model: every bound runs in its own process, and the JSON line
carries each one's time, memory and turns."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

BENCH = Path(__file__).resolve().parents[2] / "bench" / "engine_memory.py"


def test_each_store_bound_reports_its_turns_time_and_memory() -> None:
    command = [sys.executable, str(BENCH), "--model", "tiny", "--episodes", "3", "--turns", "2"]
    sizes = ["--new-tokens", "4", "--result-tokens", "20", "--store-tokens", "64,4096"]
    done = subprocess.run([*command, *sizes], check=True, capture_output=True, text=True, timeout=300)
    summary = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert set(summary["stores"]) == {"64", "4096"}
    for result in summary["stores"].values():
        assert len(result["turn_seconds"]) == 2
        assert 0 < result["end_rss_gb"] <= result["peak_rss_gb"] + 0.05
    assert summary["ratio"] > 0
    # the small store cannot keep a 470-token conversation; the large one keeps every row
    assert "kept 0 tokens" in done.stderr.split("store 4096")[0]
    assert "kept 0 tokens" not in done.stderr.split("store 4096")[1]
