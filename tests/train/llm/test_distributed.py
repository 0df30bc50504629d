"""Data-parallel updates under torchrun: two gloo ranks, each building its own trainer from the config and
the run folder, take the step one process takes on the whole batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ranks import GRPO, SFT, TINY, batch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

from sessionrl.policy.tiny import build_tiny_model, train_tokenizer
from sessionrl.train.llm.checkpoint import read_state
from sessionrl.train.llm.data import shard
from sessionrl.train.llm.distributed import decode, encode
from sessionrl.train.llm.grpo import GRPOTrainer
from sessionrl.train.llm.sft import SFTTrainer

pytestmark = pytest.mark.slow
RANKS = Path(__file__).with_name("ranks.py")


def torchrun(mode: str, folder: Path) -> None:
    """`ranks.py MODE FOLDER` on two local ranks, as `torchrun --standalone --nproc-per-node 2` runs it."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*command, str(RANKS), mode, str(folder)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def weights(folder: Path, rank: int) -> dict[str, torch.Tensor]:
    return load_file(str(folder / f"rank{rank}.safetensors"))


def test_two_ranks_take_the_step_one_process_takes_on_the_whole_batch(tmp_path: Path) -> None:
    tokenizer = train_tokenizer(["a tiny corpus of words for a tiny tokenizer"], TINY)
    model = build_tiny_model(TINY, tokenizer)
    for name in ("base", "sft_policy"):  # where the following ranks build their SFT and GRPO trainers
        model.save_pretrained(tmp_path / "run" / name)
        tokenizer.save_pretrained(tmp_path / "run" / name)
    single = LlamaForCausalLM.from_pretrained(tmp_path / "run" / "base")
    sequences = batch(len(tokenizer))
    SFTTrainer(single, SFT, 0).step(sequences)
    grpo = GRPOTrainer(single, GRPO, 0)
    grpo.step(sequences)
    grpo.step(sequences[:1])

    torchrun("step", tmp_path)

    initial = model.state_dict()
    expected = single.state_dict()
    for rank in (0, 1):
        ranked = weights(tmp_path, rank)
        assert int(ranked.pop("steps")) == 3
        assert ranked.keys() == expected.keys()
        for name, value in expected.items():
            torch.testing.assert_close(ranked[name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert any(not torch.equal(expected[k], initial[k]) for k in expected), "the update moved nothing"


def test_a_batch_travels_as_tensors_and_comes_back_equal() -> None:
    sequences = batch(300)
    lengths, values = encode(sequences)
    assert lengths.dtype == torch.int64
    assert values.shape == (5, sum(len(s) for s in sequences))
    decoded = decode(lengths, values)
    assert [s.session_id for s in decoded] == [""] * len(sequences)
    assert [s.recorded for s in decoded] == [s.recorded for s in sequences]
    for got, sent in zip(decoded, sequences, strict=True):
        assert (got.input_ids, got.loss_mask, got.old_logprobs, got.advantages) == (
            sent.input_ids,
            sent.loss_mask,
            sent.old_logprobs,
            sent.advantages,
        )


def test_the_ranks_split_a_batch_without_overlap_or_loss() -> None:
    lengths = [len(s) for s in batch(300)]
    shares = [shard(lengths, rank, 3) for rank in range(3)]
    assert sorted(i for share in shares for i in share) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in share) for share in shares]
    assert max(loads) - min(loads) <= max(lengths)


def test_train_on_two_ranks_updates_both_in_step(tmp_path: Path) -> None:
    torchrun("train", tmp_path)

    state = read_state(tmp_path / "run" / "checkpoint")
    assert state is not None
    assert state.updates > 0
    follower = weights(tmp_path, 1)
    assert int(follower.pop("steps")) == 3 + state.updates
    leader = weights(tmp_path, 0)
    leader.pop("steps")
    assert follower.keys() == leader.keys()
    for name, value in leader.items():
        torch.testing.assert_close(follower[name], value, rtol=1e-4, atol=1e-5, msg=name)
