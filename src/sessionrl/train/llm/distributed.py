"""Data-parallel training across processes launched by `torchrun` (gloo on CPU, NCCL on GPUs)::

    torchrun --standalone --nproc-per-node 2 "$(command -v sessionrl)" train config.yaml

Every rank runs the same command with the same config and calls `join` first. Rank 0 runs the loop
(episodes, store, logs, checkpoints); the other ranks `follow` it. They share the run folder with rank 0
(one machine, or a shared file system), and build their own trainer from the config and that folder:
the model rank 0 started from (`base/` or the configured checkpoint for imitation, `sft_policy/` for
GRPO, with the configured LoRA adapters), the frozen reference, the optimiser, and the optimiser state
of the checkpoint a resumed run loaded. Then every rank wraps its trainer's scorer in torch's
`DistributedDataParallel` (`sessionrl.train.llm.update.data_parallel`), which gives every rank rank 0's
weights, so each stage starts from the same parameters everywhere.

Nothing is pickled. Rank 0 sends a header of integers (`Header`) for each event: a trainer to build, a
batch to step on, the end. A batch travels as token tensors (`encode`/`decode`). Each rank trains on its
deterministic shard of it (`sessionrl.train.llm.data.shard`) and DDP averages the gradients
(`sessionrl.train.llm.update.accumulate`), so every rank takes the step one process would take on the
whole batch.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from datetime import timedelta
from enum import IntEnum
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from torch import Tensor
from torch import distributed as dist
from torch.nn.parallel import DistributedDataParallel

from sessionrl.policy.llm import HFPolicy, with_lora
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.data import TokenSequence
from sessionrl.train.llm.grpo import GRPOTrainer, frozen_copy
from sessionrl.train.llm.sft import SFTTrainer
from sessionrl.train.llm.update import UpdateStats, data_parallel, world_size
from sessionrl.train.threads import pin_threads

PATIENCE = timedelta(hours=6)
"""How long a rank waits on the others (the process group's timeout): following ranks wait through rank
0's episodes and evaluations between two updates."""


class Trainer(Protocol):
    """A trainer every rank holds: it steps on a batch of sequences (`SFTTrainer`, `GRPOTrainer`)."""

    scorer: torch.nn.Module

    @property
    def model(self) -> Any: ...

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    def step(self, sequences: Sequence[TokenSequence]) -> UpdateStats: ...


T = TypeVar("T", bound=Trainer)


class Event(IntEnum):
    """What rank 0 tells the other ranks."""

    BUILD_SFT = 1
    BUILD_GRPO = 2
    STEP = 3
    STOP = 4


@dataclass(frozen=True, slots=True)
class Header:
    """One message from rank 0, as integers: the event, the trainer's counter (SFT steps or GRPO updates
    taken) and whether a checkpoint was loaded (BUILD), the batch's size in sequences and tokens (STEP)."""

    event: Event
    counter: int = 0
    resumed: int = 0
    sequences: int = 0
    tokens: int = 0


def backend() -> str:
    """NCCL where there are GPUs, gloo otherwise."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def join() -> int:
    """Join the process group `torchrun` describes (WORLD_SIZE above 1; on a GPU machine each rank takes
    the GPU of its LOCAL_RANK) and return this rank; 0 without torchrun, or once joined already."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend(), timeout=PATIENCE)
    return dist.get_rank() if dist.is_initialized() else 0


def _device() -> torch.device:
    """Where collectives put their tensors: this rank's GPU under NCCL, the CPU under gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if backend() == "nccl" else torch.device("cpu")


def _send(header: Header) -> None:
    dist.broadcast(torch.tensor(astuple(header), dtype=torch.int64, device=_device()), src=0)


def _receive() -> Header:
    box = torch.zeros(len(fields(Header)), dtype=torch.int64, device=_device())
    dist.broadcast(box, src=0)
    event, *rest = (int(v) for v in box.tolist())
    return Header(Event(event), *rest)


# rank 0


def lead(trainer: T, *, resumed: bool = False) -> T:
    """On rank 0, after building `trainer` (and loading a checkpoint into it when `resumed`): the other
    ranks build theirs, and every rank's scorer goes data-parallel with rank 0's weights. Returns
    `trainer`; in one process, untouched."""
    if world_size() == 1:
        return trainer
    if isinstance(trainer, SFTTrainer):
        _send(Header(Event.BUILD_SFT, trainer.steps, int(resumed)))
    elif isinstance(trainer, GRPOTrainer):
        _send(Header(Event.BUILD_GRPO, trainer.updates, int(resumed)))
    else:
        raise TypeError(f"the other ranks cannot build a {type(trainer).__name__}")
    trainer.scorer = data_parallel(trainer.scorer)
    return trainer


def step_everywhere(trainer: Trainer, sequences: Sequence[TokenSequence]) -> UpdateStats:
    """On rank 0: one `trainer.step` on `sequences`, which every rank takes with it (each on its shard)."""
    if world_size() > 1:
        ids, values = encode(sequences)
        _send(Header(Event.STEP, sequences=len(sequences), tokens=int(values.shape[1])))
        dist.broadcast(ids.to(_device()), src=0)
        dist.broadcast(values.to(_device()), src=0)
    return trainer.step(sequences)


def release() -> None:
    """On rank 0, once the trainers it led are dropped: tell the other ranks there is nothing more to
    train, and leave the process group."""
    if world_size() > 1:
        _send(Header(Event.STOP))
        _leave()


# the other ranks


@dataclass(frozen=True, slots=True)
class Followed:
    """What a following rank did: the steps it took, and the last trainer it took them with."""

    steps: int
    trainer: Trainer | None


def follow(config: RunConfig) -> Followed:
    """On ranks other than 0: build each trainer rank 0 leads with and step with it on every batch it
    sends, until it releases them; then leave the process group (the last trainer, returned, no longer
    data-parallel). Sets torch's thread count first, as rank 0's `open_run` does."""
    pin_threads()
    trainer: Trainer | None = None
    steps = 0
    while (header := _receive()).event is not Event.STOP:
        if header.event is Event.STEP:
            if trainer is None:
                raise RuntimeError("rank 0 sent a batch before a trainer")
            trainer.step(_receive_sequences(header))
            steps += 1
        else:
            trainer = build_trainer(config, header)
    if trainer is not None and isinstance(trainer.scorer, DistributedDataParallel):
        trainer.scorer = trainer.scorer.module
    _leave()
    return Followed(steps, trainer)


def _leave() -> None:
    """Leave the process group after freeing what DDP wrappers are left: one freed after the group is
    gone can hang its process on exit."""
    gc.collect()
    dist.destroy_process_group()


def build_trainer(config: RunConfig, header: Header) -> Trainer:
    """This rank's trainer for the stage `header` names, from the config and the run folder, with rank 0's
    weights (and, resumed, the checkpoint's optimiser state)."""
    folder = config.run_dir
    trainer: Trainer
    if header.event is Event.BUILD_SFT:
        policy = _policy(config, config.model.checkpoint() or folder / "base")
        sft = SFTTrainer(policy.model, config.sft.trainer, policy.tokenizer.pad_token_id)
        sft.steps = header.counter
        trainer = sft
    else:
        policy = _policy(config, folder / "sft_policy")
        reference = None
        if config.rl.trainer.kl_coef > 0:
            reference = frozen_copy(HFPolicy.load(folder / "sft_policy").model)
        grpo = GRPOTrainer(policy.model, config.rl.trainer, policy.tokenizer.pad_token_id, reference)
        grpo.updates = header.counter
        trainer = grpo
    trainer.scorer = data_parallel(trainer.scorer)  # takes rank 0's weights
    saved = folder / "checkpoint" / "optimizer.pt"
    if header.resumed and saved.is_file():  # as `load_checkpoint` does on rank 0
        trainer.optimizer.load_state_dict(torch.load(saved, weights_only=True))
    return trainer


def _policy(config: RunConfig, path: str | Path) -> HFPolicy:
    policy = HFPolicy.load(path)
    if config.model.lora is not None:
        policy.model = with_lora(policy.model, config.model.lora)
    return policy


def _receive_sequences(header: Header) -> list[TokenSequence]:
    ids = torch.zeros(header.sequences, dtype=torch.int64, device=_device())
    values = torch.zeros(len(FIELDS), header.tokens, dtype=torch.float64, device=_device())
    dist.broadcast(ids, src=0)
    dist.broadcast(values, src=0)
    return decode(ids.cpu(), values.cpu())


# weights and batches as tensors


FIELDS = ("input_ids", "loss_mask", "old_logprobs", "advantages", "recorded")
"""The per-token fields of a `TokenSequence` as the rows of `encode`'s values (session ids stay home)."""


def encode(sequences: Sequence[TokenSequence]) -> tuple[Tensor, Tensor]:
    """`sequences` as their lengths ``[n]`` (int64) and their per-token fields end to end, one row per name
    of `FIELDS` ``[5, Σ len]`` (float64, which holds token ids and float logprobs exactly)."""
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.int64)
    rows = [
        [float(v) for s in sequences for v in s.input_ids],
        [float(v) for s in sequences for v in s.loss_mask],
        [v for s in sequences for v in s.old_logprobs],
        [v for s in sequences for v in s.advantages],
        [float(v) for s in sequences for v in (s.recorded or (True,) * len(s))],
    ]
    return lengths, torch.tensor(rows, dtype=torch.float64).reshape(len(FIELDS), -1)


def decode(lengths: Tensor, values: Tensor) -> list[TokenSequence]:
    """The sequences `encode` gave these tensors for (without their session ids).

    >>> a = TokenSequence((5, 6, 7), (False, True, True), (0.0, -0.5, -1.25), (0.0, 1.0, 1.0))
    >>> b = TokenSequence((8, 9), (False, True), (0.0, 0.0), (0.0, -2.0), recorded=(True, False))
    >>> decode(*encode([a, b])) == [a, b]
    True
    """
    out = []
    start = 0
    for n in lengths.tolist():
        ids, mask, old, adv, recorded = (row[start : start + n].tolist() for row in values)
        known = None if all(recorded) else tuple(bool(r) for r in recorded)
        out.append(
            TokenSequence(
                tuple(int(i) for i in ids), tuple(bool(m) for m in mask), tuple(old), tuple(adv), "", known
            )
        )
        start += n
    return out


__all__ = [
    "FIELDS",
    "PATIENCE",
    "Event",
    "Followed",
    "Header",
    "backend",
    "build_trainer",
    "decode",
    "encode",
    "follow",
    "join",
    "lead",
    "release",
    "step_everywhere",
]
