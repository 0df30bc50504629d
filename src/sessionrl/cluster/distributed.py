"""Data-parallel training processes: a `torch.distributed` process group, gloo on CPU and NCCL on GPUs.

The trainers need nothing else: once a group is up, `SFTTrainer.step` and `GRPOTrainer.step` train on
their rank's shard of the batch and sum gradients across ranks (`sessionrl.train.llm.update`). Processes
come from `torchrun` (`join` reads the rank and world from its environment) or from `spawn` here.

`sessionrl train` under `torchrun` runs its loop on rank 0 alone (episodes, store, logs, checkpoints); the
other ranks only update. Rank 0 `lead`s: it sends each trainer it builds (model, optimiser state,
settings) to the others, then every batch it steps on; they `follow` until it `release`s them.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from torch import distributed as dist
from torch.multiprocessing.spawn import spawn as start_processes

from sessionrl.train.llm.data import TokenSequence
from sessionrl.train.llm.update import UpdateStats, world_size


class Trainer(Protocol):
    """What rank 0 leads with: a trainer that steps on a batch of sequences (`SFTTrainer`, `GRPOTrainer`)."""

    def step(self, sequences: Sequence[TokenSequence]) -> UpdateStats: ...


T = TypeVar("T", bound=Trainer)


PATIENCE = timedelta(hours=6)
"""How long a rank waits on the others (the process group's timeout): following ranks wait through rank
0's episodes and evaluations between two updates."""


def backend() -> str:
    """NCCL where there are GPUs, gloo otherwise."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def join() -> int:
    """Join the process group `torchrun` describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); on a GPU
    machine each rank takes the GPU of its LOCAL_RANK. Returns the rank."""
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend(), timeout=PATIENCE)
    return dist.get_rank()


def spawn(fn: Callable[..., None], world: int, *args: Any) -> None:
    """Run `fn(rank, world, *args)` in `world` new processes that form one process group (rendezvous
    through a file in a temporary folder); returns when all have ended, raising if one failed.

    `fn` must be importable by name (a module-level function), as the processes start fresh.
    """
    if world < 1:
        raise ValueError(f"a process group needs at least one rank, got {world}")
    with tempfile.TemporaryDirectory(prefix="sessionrl-dist-") as folder:
        rendezvous = Path(folder) / "rendezvous"
        start_processes(_rank_main, args=(fn, world, str(rendezvous), args), nprocs=world, join=True)  # type: ignore[no-untyped-call]


def _rank_main(
    rank: int, fn: Callable[..., None], world: int, rendezvous: str, args: tuple[Any, ...]
) -> None:
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        backend(), init_method=f"file://{rendezvous}", rank=rank, world_size=world, timeout=PATIENCE
    )
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def joined() -> bool:
    """Whether this process is one rank of several: it joins the group `torchrun` describes (WORLD_SIZE
    above 1) when it has not yet."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        join()
    return world_size() > 1


def is_follower() -> bool:
    """Whether this process is a rank other than 0 of a process group (see `joined`)."""
    return joined() and dist.get_rank() != 0


def lead(trainer: T) -> T:
    """On rank 0: send `trainer` as it is now to the other ranks, and from now on every batch it steps on
    (they step on it too, each on its shard). Returns `trainer`; in one process, untouched."""
    if world_size() == 1:
        return trainer
    buffer = io.BytesIO()
    torch.save(trainer, buffer)
    _send(("trainer", buffer.getvalue()))
    step = trainer.step

    def step_everywhere(sequences: Sequence[TokenSequence]) -> UpdateStats:
        _send(("step", list(sequences)))
        return step(sequences)

    setattr(trainer, "step", step_everywhere)  # noqa: B010 (an instance's own step, not the class's)
    return trainer


def release() -> None:
    """On rank 0: tell the following ranks there is nothing more to train."""
    if world_size() > 1:
        _send(("stop", None))


@dataclass(frozen=True, slots=True)
class Followed:
    """What a following rank did: the steps it took, and the last trainer it took them with."""

    steps: int
    trainer: Trainer | None


def follow() -> Followed:
    """On ranks other than 0: take each trainer rank 0 leads with (on this rank's device) and step with
    it on every batch it sends, until it releases them."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    trainer: Trainer | None = None
    steps = 0
    while True:
        kind, payload = _receive()
        if kind == "stop":
            return Followed(steps, trainer)
        if kind == "trainer":
            trainer = torch.load(io.BytesIO(payload), map_location=device, weights_only=False)
        elif trainer is None:
            raise RuntimeError("rank 0 sent a batch before a trainer")
        else:
            trainer.step(payload)
            steps += 1


def _send(message: tuple[str, Any]) -> None:
    dist.broadcast_object_list([message], src=0)


def _receive() -> tuple[str, Any]:
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0)
    kind, payload = box[0]
    return str(kind), payload


__all__ = [
    "PATIENCE",
    "Followed",
    "backend",
    "follow",
    "is_follower",
    "join",
    "joined",
    "lead",
    "release",
    "spawn",
]
