"""Sessions as training data: token sequences with loss masks and advantages, packed by a token budget.

A session holds one *turn* per policy call: the prompt's token ids and the ids the policy produced (with
their log-probabilities under the sampling distribution). Consecutive turns of a session usually nest,
each prompt being the previous prompt, the previous reply and the tool's answer; such turns share one
sequence, so a session of six calls trains as one sequence rather than six copies of a growing prompt.
Where a prompt does not extend the sequence (history dropped to fit, a reply re-tokenised differently),
a new sequence starts. Only policy tokens are trained: `loss_mask` is set on the ids a turn produced
and nowhere else (system prompt, request, tool output, padding).

Expert sessions carry no tokens. `demonstration_turns` renders them as the conversation the policy would
have seen and the actions it should have written (in its tool-call format), with the same prompt
functions the rollouts use.

Batches are packed to a token budget: each micro-batch lays its sequences end to end in one row without
padding, each attending only within itself (`sessionrl.train.llm.packing`), and a prefix several of
them begin with (a GRPO group's prompt, the system prompt) lies once (`sessionrl.train.llm.prefixes`).
Sequences are taken in the order that brings those sharing a prefix together. Every policy token
weighs the same in the loss (token-level mean over the whole batch), so a session weighs in proportion to
its policy tokens. Trained data-parallel, each rank packs its own `shard` of the batch's sequences.
`collate` keeps the padded layout (one right-padded sequence per row) for losses that read whole rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import accumulate
from typing import Any, Protocol

import torch
from torch import Tensor

from sessionrl.policy.llm import tool_message
from sessionrl.policy.references import Context, abstract
from sessionrl.policy.toolcalls import ToolFormat, write_call, write_final
from sessionrl.session.model import CallStatus, Message, Session, ToolCall
from sessionrl.train.llm.prefixes import chunk_shared, prefix_tree, shareable
from sessionrl.train.losses import group_advantages


class ChatEncoder(Protocol):
    """Turns conversations and replies into token ids exactly as the policy does when it samples."""

    def encode_prompt(self, messages: Sequence[Message]) -> list[int]:
        """Ids of the prompt that asks for the assistant's next reply."""
        ...

    def encode_reply(self, text: str) -> list[int]:
        """Ids of a reply as the policy would write it, its stop token included."""
        ...


@dataclass(frozen=True, slots=True)
class Turn:
    """One policy call: its prompt, what it produced, and what that earned.

    `logprobs` are the sampling-time log-probabilities of `completion` (None for demonstrations).
    """

    prompt: tuple[int, ...]
    completion: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None
    advantage: float = 0.0


@dataclass(frozen=True, slots=True)
class TokenSequence:
    """One training sequence; every per-token field has the length of `input_ids`.

    `old_logprobs` are the behaviour policy's: the log-probabilities the sampler recorded for the tokens
    it produced. They and `advantages` are 0 where `loss_mask` is unset. `recorded` is set where
    `old_logprobs` holds such a record and unset at the policy tokens that have none (a reply rendered
    again through the chat template, a demonstration; 0 is stored there); None means every policy token
    has one.
    """

    input_ids: tuple[int, ...]
    loss_mask: tuple[bool, ...]
    old_logprobs: tuple[float, ...]
    advantages: tuple[float, ...]
    session_id: str = ""
    recorded: tuple[bool, ...] | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def policy_tokens(self) -> int:
        """How many tokens the loss counts."""
        return sum(self.loss_mask)


def merge_turns(turns: Sequence[Turn], session_id: str = "") -> list[TokenSequence]:
    """The turns of one session as few sequences: a turn whose prompt extends the current sequence joins it.

    >>> a = Turn(prompt=(1, 2), completion=(3,), logprobs=(-0.5,), advantage=1.0)
    >>> b = Turn(prompt=(1, 2, 3, 4), completion=(5, 6), logprobs=(-0.1, -0.2), advantage=1.0)
    >>> (seq,) = merge_turns([a, b])
    >>> seq.input_ids, seq.loss_mask
    ((1, 2, 3, 4, 5, 6), (False, False, True, False, True, True))
    >>> (seq,) = merge_turns([a, Turn(prompt=(1, 2, 3, 4), completion=(5,))])  # no logprobs recorded
    >>> seq.old_logprobs, seq.recorded
    ((0.0, 0.0, -0.5, 0.0, 0.0), (True, True, True, True, False))
    """
    sequences: list[TokenSequence] = []
    ids: list[int] = []
    mask: list[bool] = []
    old: list[float] = []
    adv: list[float] = []
    recorded: list[bool] = []
    for turn in turns:
        if not (ids and len(turn.prompt) >= len(ids) and tuple(ids) == turn.prompt[: len(ids)]):
            if ids:
                sequences.append(_sequence(ids, mask, old, adv, recorded, session_id))
            ids, mask, old, adv, recorded = [], [], [], [], []
        context = turn.prompt[len(ids) :]
        ids += context
        mask += [False] * len(context)
        old += [0.0] * len(context)
        adv += [0.0] * len(context)
        recorded += [True] * len(context)
        ids += turn.completion
        mask += [True] * len(turn.completion)
        old += list(turn.logprobs) if turn.logprobs is not None else [0.0] * len(turn.completion)
        adv += [turn.advantage] * len(turn.completion)
        recorded += [turn.logprobs is not None] * len(turn.completion)
    if ids:
        sequences.append(_sequence(ids, mask, old, adv, recorded, session_id))
    return sequences


def _sequence(
    ids: list[int],
    mask: list[bool],
    old: list[float],
    adv: list[float],
    recorded: list[bool],
    session_id: str,
) -> TokenSequence:
    known = None if all(recorded) else tuple(recorded)
    return TokenSequence(tuple(ids), tuple(mask), tuple(old), tuple(adv), session_id, known)


def policy_turns(session: Session, advantages: Mapping[str, float]) -> list[Turn]:
    """The session's own policy calls (those with token ids), each with its advantage by call id."""
    return [
        Turn(
            prompt=call.prompt_token_ids,
            completion=call.token_ids,
            logprobs=call.logprobs,
            advantage=advantages.get(call.call_id, 0.0),
        )
        for call in session.llm_calls
        if call.prompt_token_ids is not None and call.token_ids
    ]


def call_message(call: ToolCall, max_chars: int) -> Message:
    """The tool message an agent reads after `call` (the same text a rollout shows)."""
    return tool_message(
        tool=call.tool,
        ok=call.status == CallStatus.SUCCESS,
        output=call.output,
        error_code=call.error_code,
        error_message=call.error_message,
        max_chars=max_chars,
    )


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply in a conversation: the messages it answers and its text."""

    messages: tuple[Message, ...]
    text: str


def demonstration_replies(
    session: Session, system: str, max_tool_chars: int, fmt: ToolFormat = ToolFormat.ACTION
) -> list[Reply]:
    """An expert session as the replies a policy should write: one tool call per call, then the final
    answer, each answering the conversation so far (`system` is the rollouts' system prompt), in the
    tool-call format `fmt`.

    In the action language, values the conversation already holds are written as references
    (`sessionrl.policy.references`); the other formats, for pretrained models, write them out.
    """
    messages = [Message(role="system", content=system), Message(role="user", content=session.user_query)]
    replies: list[Reply] = []
    action_language = fmt is ToolFormat.ACTION
    for call in session.tool_calls:
        params = abstract(call.params, Context.from_messages(messages)) if action_language else call.params
        action = write_call(fmt, call.tool, params)
        replies.append(Reply(tuple(messages), action))
        messages += [Message(role="assistant", content=action), call_message(call, max_tool_chars)]
    if session.final_output is not None:
        text = session.final_output.text
        answer = abstract(text, Context.from_messages(messages)) if action_language else text
        replies.append(Reply(tuple(messages), write_final(fmt, answer)))
    return replies


def demonstration_turns(
    session: Session,
    system: str,
    encoder: ChatEncoder,
    max_tool_chars: int,
    fmt: ToolFormat = ToolFormat.ACTION,
) -> list[Turn]:
    """An expert session as the turns a policy should produce (`demonstration_replies`, tokenised)."""
    return [
        Turn(tuple(encoder.encode_prompt(r.messages)), tuple(encoder.encode_reply(r.text)))
        for r in demonstration_replies(session, system, max_tool_chars, fmt)
    ]


# advantages


def session_advantages(
    rewards: Mapping[str, float], groups: Mapping[str, str], tolerance: float = 1e-6
) -> dict[str, float]:
    """GRPO advantages by session id: each reward against the mean and std of its group's rewards.

    A group whose rewards lie within `tolerance` of each other carries no signal and gets 0: dividing
    tiny differences (say, of delay discounts) by their tiny std would turn noise into full-size advantages.

    >>> adv = session_advantages({"a": 1.0, "b": 0.0, "c": 5.0}, {"a": "g", "b": "g", "c": "h"})
    >>> round(adv["a"], 3), round(adv["b"], 3), adv["c"]
    (1.0, -1.0, 0.0)
    >>> session_advantages({"a": -1.0, "b": -1.0 + 1e-9}, {"a": "g", "b": "g"})
    {'a': 0.0, 'b': 0.0}
    """
    ids = list(rewards)
    labels = {name: i for i, name in enumerate(dict.fromkeys(groups[s] for s in ids))}
    values = torch.tensor([rewards[s] for s in ids], dtype=torch.float64)
    group_ids = torch.tensor([labels[groups[s]] for s in ids])
    adv = group_advantages(values, group_ids) if ids else values
    spread: dict[str, list[float]] = {}
    for s in ids:
        spread.setdefault(groups[s], []).append(rewards[s])
    flat = {g for g, rs in spread.items() if max(rs) - min(rs) <= tolerance}
    return {s: 0.0 if groups[s] in flat else float(a) for s, a in zip(ids, adv.tolist(), strict=True)}


def call_advantages(
    session: Session, advantage: float, step_rewards: Mapping[str, float], step_coef: float
) -> dict[str, float]:
    """Advantage of each policy call of a session: the session's, plus `step_coef` times the step reward
    credited to the call itself or to the tool calls it led to (those started after it, before the next
    policy call)."""
    calls = sorted(session.llm_calls, key=lambda c: c.started_at)
    earned = {c.call_id: step_rewards.get(c.call_id, 0.0) for c in calls}
    for tool_call in session.tool_calls:
        chooser = [c for c in calls if c.started_at <= tool_call.started_at]
        if chooser:
            earned[chooser[-1].call_id] += step_rewards.get(tool_call.call_id, 0.0)
    return {call_id: advantage + step_coef * reward for call_id, reward in earned.items()}


def lag(session: Session, version: int) -> int:
    """How many versions behind `version` the oldest policy call of `session` was sampled."""
    versions = [c.policy_version for c in session.llm_calls if c.policy_version is not None]
    return version - min(versions) if versions else 0


# packing


def pack(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices grouped into micro-batches whose padded size (rows x longest) stays within `budget`.

    First-fit decreasing: longest first, each into the first micro-batch it fits. A sequence longer
    than the budget gets a micro-batch of its own.

    >>> pack([5, 2, 4, 3], budget=8)
    [[0], [2, 3], [1]]
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    widths: list[int] = []
    for i in order:
        for b, width in enumerate(widths):
            if (len(batches[b]) + 1) * width <= budget:
                batches[b].append(i)
                break
        else:
            batches.append([i])
            widths.append(lengths[i])
    return batches


def shard(lengths: Sequence[int], rank: int, world: int) -> list[int]:
    """The indices rank `rank` of `world` trains on: longest first, each to the rank holding the fewest
    tokens so far (the lowest rank on a tie), so ranks get near-equal work and every rank, given the same
    lengths, computes the same split.

    >>> [shard([5, 2, 4, 3], rank, 2) for rank in (0, 1)]
    [[0, 1], [2, 3]]
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")
    loads = [0] * world
    mine: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        to = loads.index(min(loads))
        loads[to] += lengths[i]
        if to == rank:
            mine.append(i)
    return sorted(mine)


def fixed_batches(count: int, size: int) -> list[list[int]]:
    """Indices in arrival order, `size` per micro-batch (the usual fixed-count batching, for comparison).

    >>> fixed_batches(5, 2)
    [[0, 1], [2, 3], [4]]
    """
    return [list(range(start, min(start + size, count))) for start in range(0, count, size)]


def padding_fraction(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Share of the padded token slots that hold padding: ``1 - Σ len / Σ rows·longest``.

    >>> padding_fraction([4, 2], [[0, 1]])  # 6 real tokens in 2 x 4 slots
    0.25
    """
    slots = sum(len(b) * max(lengths[i] for i in b) for b in batches if b)
    return 1.0 - sum(lengths[i] for b in batches for i in b) / slots if slots else 0.0


@dataclass(frozen=True)
class MicroBatch:
    """Tensors of some sequences, all ``[B, T]``, in one of two layouts.

    Padded (`collate`): one right-padded sequence per row, `attention_mask` marking real tokens. Packed
    (`concatenate`): segments end to end in one row (``B = 1``), `segments` holding their boundaries
    ``[0, n_1, n_1 + n_2, ..., T]`` and `parents` the segment each one continues (``-1``: none, its
    positions start at 0), `position_ids` each token's position in its sequence. `recorded` marks where
    `old_logprobs` holds a behaviour log-prob (see `TokenSequence`; None: everywhere); `proximal`, when
    set, the trainer's own log-probs of the tokens before its step (`GRPOTrainer` over several epochs).
    """

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    position_ids: Tensor | None = None
    segments: Tensor | None = None
    parents: Tensor | None = None
    recorded: Tensor | None = None
    proximal: Tensor | None = None

    @property
    def policy_tokens(self) -> int:
        """How many tokens the loss counts in this micro-batch."""
        return int(self.loss_mask.sum().item())

    def to(self, device: torch.device) -> MicroBatch:
        """The same micro-batch on `device`."""
        moved: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            moved[f.name] = None if value is None else value.to(device)
        return MicroBatch(**moved)


def collate(sequences: Sequence[TokenSequence], pad_id: int) -> MicroBatch:
    """Right-pad `sequences` into one micro-batch."""
    width = max(len(s) for s in sequences)
    shape = (len(sequences), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    loss = torch.zeros(shape, dtype=torch.bool)
    old = torch.zeros(shape, dtype=torch.float32)
    adv = torch.zeros(shape, dtype=torch.float32)
    recorded = torch.ones(shape, dtype=torch.bool)
    for row, s in enumerate(sequences):
        n = len(s)
        ids[row, :n] = torch.tensor(s.input_ids)
        attention[row, :n] = 1
        loss[row, :n] = torch.tensor(s.loss_mask)
        old[row, :n] = torch.tensor(s.old_logprobs)
        adv[row, :n] = torch.tensor(s.advantages)
        if s.recorded is not None:
            recorded[row, :n] = torch.tensor(s.recorded)
    return MicroBatch(ids, attention, loss, old, adv, recorded=_unless_all(recorded))


def _unless_all(recorded: Tensor) -> Tensor | None:
    """`recorded`, or None where every token has a behaviour log-prob."""
    return None if bool(recorded.all()) else recorded


def concatenate(sequences: Sequence[TokenSequence], share_prefixes: bool = True) -> MicroBatch:
    """`sequences` in one packed row (see `MicroBatch`): with `share_prefixes`, the segments of their
    `prefix_tree` (a prefix several sequences begin with lies once), else one segment per sequence.

    The first token of a segment is never a loss position (it would be predicted from the segment before
    it in the row); it is a sequence's first token or a token before its first policy token, so this drops
    nothing a turn produced.

    >>> a = TokenSequence((1, 2, 3), (False, False, True), (0.0, 0.0, -0.5), (0.0, 0.0, 1.0))
    >>> b = TokenSequence((1, 2, 4, 5), (False, False, True, True), (0.0,) * 4, (0.0, 0.0, 2.0, 2.0))
    >>> micro = concatenate([a, b])
    >>> micro.input_ids.tolist(), micro.position_ids.tolist()
    ([[1, 2, 3, 2, 4, 5]], [[0, 1, 2, 1, 2, 3]])
    >>> micro.segments.tolist(), micro.parents.tolist()
    ([0, 1, 3, 6], [-1, 0, 0])
    >>> concatenate([a, b], share_prefixes=False).segments.tolist()
    [0, 3, 7]
    """
    keys = [s.input_ids[: shareable(s.loss_mask)] if share_prefixes else () for s in sequences]
    tree = prefix_tree(keys, [len(s) for s in sequences])
    spans = [(sequences[t.sequence], slice(t.start, t.end)) for t in tree]
    starts = [0, *accumulate(t.end - t.start for t in tree)]
    ids = torch.tensor([[i for s, span in spans for i in s.input_ids[span]]], dtype=torch.long)
    loss = torch.tensor([[m for s, span in spans for m in s.loss_mask[span]]], dtype=torch.bool)
    loss[0, starts[:-1]] = False
    old = torch.tensor([[v for s, span in spans for v in s.old_logprobs[span]]], dtype=torch.float32)
    adv = torch.tensor([[v for s, span in spans for v in s.advantages[span]]], dtype=torch.float32)
    recorded = torch.tensor(
        [[r for s, span in spans for r in (s.recorded or (True,) * len(s))[span]]], dtype=torch.bool
    )
    positions = torch.cat([torch.arange(t.start, t.end) for t in tree])[None]
    segments = torch.tensor(starts, dtype=torch.int32)
    parents = torch.tensor([t.parent for t in tree], dtype=torch.int32)
    return MicroBatch(
        ids, torch.ones_like(ids), loss, old, adv, positions, segments, parents, _unless_all(recorded)
    )


def pack_end_to_end(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices grouped into micro-batches of at most `budget` tokens laid end to end (first-fit
    decreasing; a sequence longer than the budget gets one of its own); each group in index order.

    >>> pack_end_to_end([5, 2, 4, 3], budget=8)
    [[0, 3], [1, 2]]
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for b, load in enumerate(loads):
            if load + lengths[i] <= budget:
                batches[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            batches.append([i])
            loads.append(lengths[i])
    return [sorted(b) for b in batches]


@dataclass(frozen=True)
class PackedBatch:
    """One optimiser step's data: its micro-batches, the tokens of its sequences (`tokens`) and those its
    micro-batches compute (`computed`, fewer where prefixes are shared). Packed rows hold no padding."""

    micro: tuple[MicroBatch, ...]
    policy_tokens: int
    tokens: int
    computed: int

    def __iter__(self) -> Iterator[MicroBatch]:
        return iter(self.micro)


def packed(sequences: Sequence[TokenSequence], budget: int, share_prefixes: bool = True) -> PackedBatch:
    """`sequences` in micro-batches of at most `budget` computed tokens, each one packed row
    (`concatenate`): no slot is padding. With `share_prefixes`, sequences go in key order
    (`chunk_shared`), so those beginning alike meet in one micro-batch and share their prefix; without,
    `pack_end_to_end` fills the micro-batches."""
    lengths = [len(s) for s in sequences]
    if not sequences:  # a data-parallel rank's empty shard
        groups = []
    elif share_prefixes:
        groups = chunk_shared([s.input_ids[: shareable(s.loss_mask)] for s in sequences], lengths, budget)
    else:
        groups = pack_end_to_end(lengths, budget)
    micro = tuple(concatenate([sequences[i] for i in g], share_prefixes) for g in groups)
    return PackedBatch(
        micro=micro,
        policy_tokens=sum(int(m.loss_mask.sum()) for m in micro),
        tokens=sum(lengths),
        computed=sum(m.input_ids.shape[1] for m in micro),
    )


__all__ = [
    "ChatEncoder",
    "MicroBatch",
    "PackedBatch",
    "Reply",
    "TokenSequence",
    "Turn",
    "call_advantages",
    "call_message",
    "collate",
    "concatenate",
    "demonstration_replies",
    "demonstration_turns",
    "fixed_batches",
    "lag",
    "merge_turns",
    "pack",
    "pack_end_to_end",
    "packed",
    "padding_fraction",
    "policy_turns",
    "session_advantages",
    "shard",
]
