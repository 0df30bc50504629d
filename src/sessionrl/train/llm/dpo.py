"""DPO for the LLM policy, from pairwise preferences stored in Decision Sessions.

Preference convention
---------------------
A preference is one `Feedback` of type `FeedbackType.PREFERENCE` on a session. Its `data` names the
preferred (chosen) and the dispreferred (rejected) reply to one conversation. Each side is given either as
the id of an LLM call recorded in that session (its `response` is the reply) or as text:

* ``data["chosen_call_id"]`` **or** ``data["chosen"]`` (the reply text), exactly one of them;
* ``data["rejected_call_id"]`` **or** ``data["rejected"]``, exactly one of them.

The prompt is the `messages` of the named call (of the chosen one when both sides name calls, and then
both calls must have been asked the same messages). At least one side must name a call, so the prompt
is known. Typical cases: an annotator compares two sampled replies (two call ids); a reviewer rewrites
a bad reply (``chosen`` text, ``rejected_call_id``); an approved reply beats a known-bad one
(``chosen_call_id``, ``rejected`` text). The feedback's `score`, `comment` and anchor are not read.

Training
--------
`DPOTrainer` minimises `sessionrl.train.losses.dpo_loss` on the summed log-probability of each whole reply
(its tokens and the stop token, encoded as the policy encodes them when it samples: `ChatEncoder`) under
the policy and under a frozen reference. The reference is a frozen copy of the policy's model as it was
when the trainer was built, unless one is passed in; its log-probabilities are computed once.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from sessionrl.policy.llm import HFPolicy
from sessionrl.session.model import FeedbackType, LLMCall, Message, Session
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.train.llm.data import ChatEncoder, MicroBatch, TokenSequence, collate
from sessionrl.train.losses import dpo_loss


@dataclass(frozen=True, slots=True)
class DPOConfig:
    """How DPO trains."""

    beta: float = field(default=0.1, metadata={"help": "strength of the implicit KL to the reference"})
    lr: float = field(
        default=1e-5,
        metadata={"help": "AdamW learning rate (1e-4 unlearned a tiny model's imitation in 100 steps)"},
    )
    steps: int = field(default=50, metadata={"help": "optimiser steps"})
    batch_size: int = field(default=8, metadata={"help": "preference pairs per step"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient norm clip"})
    seed: int = field(default=0, metadata={"help": "seed of the batch order"})

    def __post_init__(self) -> None:
        if self.beta <= 0 or self.lr <= 0 or self.max_grad_norm <= 0:
            raise ValueError("DPOConfig needs beta > 0, lr > 0 and max_grad_norm > 0")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("DPOConfig needs steps >= 1 and batch_size >= 1")


@dataclass(frozen=True, slots=True)
class Preference:
    """One preference read from a session: the conversation, and the chosen and rejected replies."""

    session_id: str
    feedback_id: str
    messages: tuple[Message, ...]
    chosen: str
    rejected: str


@dataclass(frozen=True, slots=True)
class PairTokens:
    """A preference as token ids: the prompt shared by both replies, and each reply's ids."""

    prompt: tuple[int, ...]
    chosen: tuple[int, ...]
    rejected: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DPOLog:
    """What one step did (plain floats): the loss, the mean implicit-reward margin and the pair accuracy."""

    step: int
    loss: float
    margin: float
    accuracy: float


def _side(data: Mapping[str, Any], side: str, calls: Mapping[str, LLMCall]) -> tuple[str, LLMCall | None]:
    """One side's reply text and, when it names a call, that call (see the module doc)."""
    call_id, text = data.get(f"{side}_call_id"), data.get(side)
    if (call_id is None) == (text is None):
        raise ValueError(f"a preference gives exactly one of {side}_call_id and {side}")
    if text is not None:
        if not isinstance(text, str):
            raise ValueError(f"preference {side} must be text, got {type(text).__name__}")
        return text, None
    call = calls.get(str(call_id))
    if call is None:
        raise ValueError(f"preference names {side}_call_id {call_id!r}, which is no LLM call of the session")
    return call.response, call


def session_preferences(session: Session) -> list[Preference]:
    """Every preference of `session`, in feedback order; a malformed one raises `ValueError`."""
    calls = {call.call_id: call for call in session.llm_calls}
    found = []
    for feedback in session.feedback:
        if feedback.type != FeedbackType.PREFERENCE:
            continue
        chosen, chosen_call = _side(feedback.data, "chosen", calls)
        rejected, rejected_call = _side(feedback.data, "rejected", calls)
        source = chosen_call or rejected_call
        if source is None:
            raise ValueError(f"preference {feedback.feedback_id} names no call, so its prompt is unknown")
        if chosen_call and rejected_call and chosen_call.messages != rejected_call.messages:
            raise ValueError(f"preference {feedback.feedback_id} compares replies to different conversations")
        found.append(Preference(session.session_id, feedback.feedback_id, source.messages, chosen, rejected))
    return found


def stored_preferences(store: SessionStore, *, limit: int = 100_000) -> list[Preference]:
    """Every preference in the store's sessions that have preference feedback, by session creation."""
    rows = store.query(SessionQuery(feedback_type=FeedbackType.PREFERENCE, limit=limit))
    return [p for row in rows for p in session_preferences(store.get(row.session_id))]


def tokenize_preference(preference: Preference, encoder: ChatEncoder) -> PairTokens:
    """Token ids of the prompt and of each reply, exactly as the policy encodes them when it samples."""
    return PairTokens(
        prompt=tuple(encoder.encode_prompt(preference.messages)),
        chosen=tuple(encoder.encode_reply(preference.chosen)),
        rejected=tuple(encoder.encode_reply(preference.rejected)),
    )


def reply_logprobs(model: Any, batch: MicroBatch) -> Tensor:
    """Summed log-probability of the `loss_mask` tokens of each row, shape ``[B]`` (keeps the gradient).

    Token ``t`` is scored by the logits at ``t - 1``, so the first token of a row is never counted.
    """
    device = next(model.parameters()).device
    batch = batch.to(device)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    targets = batch.input_ids[:, 1:, None]
    token_logp = torch.log_softmax(logits, dim=-1).gather(-1, targets).squeeze(-1)
    return (token_logp * batch.loss_mask[:, 1:]).sum(-1)


def _rows(prompt: Sequence[int], reply: Sequence[int]) -> TokenSequence:
    """`prompt + reply` as one sequence whose loss mask covers the reply."""
    zeros = (0.0,) * (len(prompt) + len(reply))
    mask = (False,) * len(prompt) + (True,) * len(reply)
    return TokenSequence(tuple(prompt) + tuple(reply), mask, zeros, zeros)


class DPOTrainer:
    """DPO on an `HFPolicy`'s model against a frozen reference (a copy of the model unless one is given).

    The policy's weights change in place and its `version` rises by one per optimiser step.
    """

    def __init__(self, policy: HFPolicy, config: DPOConfig, *, reference: Any | None = None) -> None:
        self.policy = policy
        self.config = config
        self.reference = reference if reference is not None else copy.deepcopy(policy.model)
        self.reference.eval()
        self.reference.requires_grad_(False)
        trainable = [p for p in policy.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=config.lr)

    def logprobs(self, model: Any, pairs: Sequence[PairTokens]) -> tuple[Tensor, Tensor]:
        """Summed reply log-probabilities ``([B] chosen, [B] rejected)`` of `pairs` under `model`."""
        rows = [_rows(p.prompt, p.chosen) for p in pairs] + [_rows(p.prompt, p.rejected) for p in pairs]
        both = reply_logprobs(model, collate(rows, int(self.policy.tokenizer.pad_token_id)))
        return both[: len(pairs)], both[len(pairs) :]

    def fit(self, preferences: Iterable[Preference]) -> list[DPOLog]:
        """Train for `config.steps` steps on `preferences`; return one log per step."""
        cfg, model = self.config, self.policy.model
        pairs = [tokenize_preference(p, self.policy) for p in preferences]
        if not pairs:
            raise ValueError("DPO needs at least one preference pair")
        # reference: the frozen model's log-probabilities, once per pair (a batch at a time, so the logits
        # of every pair are never held at once)
        with torch.no_grad():
            chunks = [
                self.logprobs(self.reference, pairs[i : i + cfg.batch_size])
                for i in range(0, len(pairs), cfg.batch_size)
            ]
        ref_chosen = torch.cat([c for c, _ in chunks])
        ref_rejected = torch.cat([r for _, r in chunks])
        order = random.Random(cfg.seed)
        logs = []
        model.train()
        for step in range(cfg.steps):
            # batch
            picked = order.sample(range(len(pairs)), min(cfg.batch_size, len(pairs)))
            # loss
            chosen, rejected = self.logprobs(model, [pairs[i] for i in picked])
            result = dpo_loss(chosen, rejected, ref_chosen[picked], ref_rejected[picked], beta=cfg.beta)
            # update
            self.optimizer.zero_grad(set_to_none=True)
            torch.autograd.backward(result.loss)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            self.policy.version += 1
            # log
            logs.append(DPOLog(step, result.loss.item(), result.margins.mean().item(), result.accuracy))
        model.eval()
        return logs


__all__ = [
    "DPOConfig",
    "DPOLog",
    "DPOTrainer",
    "PairTokens",
    "Preference",
    "reply_logprobs",
    "session_preferences",
    "stored_preferences",
    "tokenize_preference",
]
