"""Opening a run sets torch's thread count (sessionrl.train.threads): while the count is left at torch's
choice, its CPU attention backward sums gradients in another order than once the same count is set.

The test watches `torch.set_num_threads` rather than comparing gradients across two processes: on a loaded
two-core machine an occasional fresh process computes a two-thread forward pass in yet another float order
(measured: 1 of 24 processes, under two busy loops), so a bit-for-bit comparison would fail by chance.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sessionrl.train.config import RunConfig
from sessionrl.train.llm.run import open_run
from sessionrl.train.threads import pin_threads, torch_threads
from tiny_run_support import tiny_run


def test_opening_a_run_sets_the_thread_count_torch_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    set_count = torch.set_num_threads

    def watched(count: int) -> None:
        calls.append(count)
        set_count(count)

    config = RunConfig.model_validate(tiny_run(run_dir=str(tmp_path / "run")))
    with torch_threads(torch.get_num_threads()):
        chosen = torch.get_num_threads()
        monkeypatch.setattr(torch, "set_num_threads", watched)
        open_run(config).close()
        assert calls == [chosen]
        open_run(config).close()  # reopened, as a resumed run is
        assert calls == [chosen, chosen]


def test_pin_threads_sets_the_count_asked_for_or_keeps_torchs() -> None:
    with torch_threads(torch.get_num_threads()):
        before = torch.get_num_threads()
        assert pin_threads() == before == torch.get_num_threads()
        assert pin_threads(1) == 1 == torch.get_num_threads()
