"""A run's gradients do not depend on whether its caller set torch's thread count (sessionrl.train.threads):
opening the run (`open_run`) sets it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sessionrl.train.threads import pin_threads, torch_threads

STEP = """
import hashlib, sys
from pathlib import Path
import torch
sys.path.insert(0, {tests!r})
from tiny_run_support import tiny_run
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.run import build_policy, open_run

if sys.argv[1] == "set":
    torch.set_num_threads(torch.get_num_threads())
heads = {{"hidden_size": 64, "num_heads": 2}}  # heads of 32: where the attention backward differed
config = RunConfig.model_validate(tiny_run(run_dir=sys.argv[2], model={{"tiny": heads}}))
open_run(config).close()  # opening the run is what sets the count
policy = build_policy(config, ["the order #W123 ships to Lisbon"] * 4, Path(sys.argv[2]) / "base")
ids = torch.randint(0, policy.model.config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(0))
policy.model(input_ids=ids, labels=ids).loss.backward()
grads = b"".join(p.grad.numpy().tobytes() for p in policy.model.parameters() if p.grad is not None)
print(torch.get_num_threads(), hashlib.sha256(grads).hexdigest())
"""


def test_a_training_step_is_the_same_whether_or_not_the_caller_set_the_thread_count(tmp_path: Path) -> None:
    if torch.get_num_threads() < 2:
        pytest.skip("one torch thread: nothing to reorder")
    code = STEP.format(tests=str(Path(__file__).resolve().parents[2]))
    printed = {
        how: subprocess.run(
            [sys.executable, "-c", code, how, str(tmp_path / how)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        for how in ("left", "set")
    }
    assert printed["left"] == printed["set"]
    assert int(printed["left"][0]) >= 2  # the count torch chose, kept


def test_pin_threads_sets_the_count_asked_for_or_keeps_torchs() -> None:
    with torch_threads(torch.get_num_threads()):
        before = torch.get_num_threads()
        assert pin_threads() == before == torch.get_num_threads()
        assert pin_threads(1) == 1 == torch.get_num_threads()
