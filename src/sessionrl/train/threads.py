"""Torch's CPU thread count, which a run's floats depend on.

A seed gives the same run for the same thread count, and only once the count has been *set*. While it
is left at torch's choice, torch's CPU attention backward adds up gradients in another order than it does
once the same count is set: on a two-core machine `torch.get_num_threads()` says 2 either way, yet the
gradients of `scaled_dot_product_attention` with heads of 32 dimensions match those of one thread until
`torch.set_num_threads(2)` is called. (Measured with torch 2.13; heads of 16 dimensions, forward passes
and matrix products agree bit for bit.) An imitation run trained with the count left alone and one
trained with it set therefore end on different weights, and a small run's held-out figures differ by more
than the gains we measure. So opening a run (`open_run`, and each other rank of a `torchrun` launch) sets
it, to the count torch chose, and `sessionrl train --threads N` to N (`pin_threads`).

Setting the count makes one thread reproducible, not two. At two threads, once a matrix product has run,
float32 `exp` returns other bits in about one fresh process in three (measured with torch 2.13 and MKL
2024.2 on this build, 30 processes each; within one process it never changes; `MKL_CBWR` does not remove it,
one thread does). A two-thread run of a seed is therefore one of a few neighbouring runs, chosen per
process; the learning bench measures its acceptance line at one thread and at two for that reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def pin_threads(count: int | None = None) -> int:
    """Set torch's CPU thread count to `count`, or to the count torch chose when None, and return it."""
    count = torch.get_num_threads() if count is None else count
    torch.set_num_threads(count)
    return count


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with `count` torch CPU threads, then restore the caller's setting.

    The structured trainers use it: their skill-policy networks are small enough to spend more time
    synchronising threads than computing, so one thread trains them faster than several.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
