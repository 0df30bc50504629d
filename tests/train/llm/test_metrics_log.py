"""The run's metrics log: each record carries the process's memory high-water mark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

WRITER = """
import os
import resource
import sys
from pathlib import Path
from sessionrl.train.llm.run import MetricsLog

log = MetricsLog(Path(sys.argv[1]))
log.write("sft", 0, {"loss": 1.0})
resident = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
held = bytearray(max(peak - resident, 0) + 256 * 2**20)  # past the mark imports may have left, then 256 MiB
held[:: 4096] = b"x" * len(held[:: 4096])  # touch every page, so all of it is resident
log.write("rl", 0, {"loss": 0.5})
log.close()
"""


def test_records_carry_the_memory_high_water_mark_as_it_rises(tmp_path: Path) -> None:
    # a fresh process: the suite's own high-water mark could already lie above anything allocated here
    subprocess.run([sys.executable, "-c", WRITER, str(tmp_path)], check=True, timeout=120)
    first, second = (json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())
    assert first["max_rss_mb"] > 0
    assert second["max_rss_mb"] - first["max_rss_mb"] >= 200  # the 256 MiB just allocated
    assert second["loss"] == 0.5
