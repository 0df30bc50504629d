"""Drafts from a reply's own context, checked in one pass: several tokens a decode step where they hold.

An agent's replies repeat their context: a tool call names an id a tool result printed, its format is the
one every earlier call used. `Lookup` proposes the tokens that followed the last time the reply's latest
few tokens appeared in the prompt or the reply (prompt lookup); the engine runs the drawn token and the
draft through the model in one pass, and `accepted` keeps the draft's longest prefix the model would have
drawn itself:

- greedy: a draft token is kept while it is the most likely token;
- sampled: draft token ``d`` is kept with probability ``p(d)`` under the sampling distribution; at the
  first one refused, the next token is drawn from ``p`` with ``d`` left out (`residual`). Each token is
  then distributed exactly as if drawn one a step (speculative sampling with a draft that is certain of
  its tokens), so the recorded logprobs are the policy's own.

A decode step reads every weight once whatever the number of tokens it computes, so on a CPU, where that
read is most of a small batch's step (docs/engines.md), a kept draft token costs little.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class Lookup:
    """The tokens of one row's context (prompt, then its reply as drawn) and, for every `n`-gram in it,
    where the token after its latest occurrence stands.

    >>> row = Lookup([5, 6, 7, 8, 5, 6], n=2)
    >>> row.draft(3)
    [7, 8, 5]
    >>> row.append(9); row.draft(3)
    []
    """

    def __init__(self, tokens: Sequence[int], n: int = 3) -> None:
        self.tokens: list[int] = []
        self.n = n
        self._after: dict[tuple[int, ...], int] = {}
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """Add the next token of the context."""
        if len(self.tokens) >= self.n:
            self._after[tuple(self.tokens[-self.n :])] = len(self.tokens)
        self.tokens.append(token)

    def draft(self, k: int) -> list[int]:
        """Up to `k` tokens that followed the last `n` tokens where they appeared before; none when they
        did not."""
        at = self._after.get(tuple(self.tokens[-self.n :])) if k > 0 else None
        return [] if at is None else self.tokens[at : at + k]


def accepted(
    logits: Tensor, drafts: Tensor, lengths: Tensor, temperature: float, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """How many of each row's draft tokens to keep, and their logprobs.

    `logits` ``[B, K, V]``: the model's next-token logits before each draft token (position j judges
    draft token j); `drafts` ``[B, K]`` (padded past `lengths`, ``[B]``). Returns ``(kept [B], logp
    [B, K])``: the length of each row's kept prefix, and every draft token's logprob under the sampling
    distribution (softmax of logits / temperature; plain softmax when greedy), read where kept.

    >>> logits = torch.tensor([[[0.0, 9.0], [9.0, 0.0]]])
    >>> accepted(logits, torch.tensor([[1, 1]]), torch.tensor([2]), 0.0, torch.Generator())[0]
    tensor([1])
    """
    scaled = logits.float() if temperature == 0 else logits.float() / temperature
    logp = torch.log_softmax(scaled, dim=-1).gather(-1, drafts[..., None]).squeeze(-1)
    if temperature == 0:
        holds = scaled.argmax(dim=-1) == drafts
    else:
        draws = torch.rand(drafts.shape, generator=generator, dtype=logp.dtype, device="cpu")
        holds = draws.to(logp.device) < logp.exp()
    within = torch.arange(drafts.shape[1], device=drafts.device)[None, :] < lengths[:, None]
    kept = (holds & within).long().cumprod(dim=-1).sum(dim=-1)
    return kept, logp


def residual(probs: Tensor, refused: Tensor) -> Tensor:
    """`probs` ``[B, V]`` with each row's refused draft token (`refused` ``[B]``, -1 for none) given
    probability 0: what a refused row's next token is drawn from (`inverse_cdf` draws in proportion).

    >>> residual(torch.full((2, 3), 0.5), torch.tensor([1, -1])).tolist()
    [[0.5, 0.0, 0.5], [0.5, 0.5, 0.5]]
    """
    rows = (refused >= 0).nonzero().squeeze(-1)
    out = probs.clone()
    out[rows, refused[rows]] = 0.0
    return out


__all__ = ["Lookup", "accepted", "residual"]
