"""Data-parallel training processes: a `torch.distributed` process group, gloo on CPU and NCCL on GPUs.

The trainers need nothing else: once a group is up, `SFTTrainer.step` and `GRPOTrainer.step` train on
their rank's shard of the batch and sum gradients across ranks (`sessionrl.train.llm.update`). Processes
come from `torchrun` (`join` reads the rank and world from its environment) or from `spawn` here.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import distributed as dist
from torch.multiprocessing.spawn import spawn as start_processes


def backend() -> str:
    """NCCL where there are GPUs, gloo otherwise."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def join() -> int:
    """Join the process group `torchrun` describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); on a GPU
    machine each rank takes the GPU of its LOCAL_RANK. Returns the rank."""
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend())
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
    dist.init_process_group(backend(), init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


__all__ = ["backend", "join", "spawn"]
