"""Per-turn tool accuracy: teacher-forced on a gold trajectory, did the policy call the right tool, with
the exact arguments, and did its reply parse at all?

A held-out task's gold trajectory (the expert's episode) gives, for each of its tool calls, the
conversation up to that call and the reply the expert wrote there. The policy answers each of those
conversations once; its reply and the expert's are read the way an episode reads a reply
(`parse_reply`, then references resolved against the conversation) and compared:

- parsed: the reply is an action in the policy's format (a tool call or an answer to the user);
- tool: it calls the tool the expert called;
- exact: it calls that tool with the expert's arguments, equal once references are resolved.

Only turns where the expert calls a tool are scored; the turns where it answers the user have no tool or
arguments to be exact about, and `ToolAccuracy.answers` counts them. Every turn starts from the gold
prefix, so a policy that goes wrong at its first step is still judged on the later ones: the metric is
dense enough to move where whole tasks stay out of reach.

Accuracy pools the turns of all tasks. A task's turns are not independent of each other, so the paired
interval between two policies (`accuracy_change`) resamples tasks, each with its own count of exact turns
and turns (`sessionrl.eval.significance.paired_ratio_diff_ci`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from sessionrl.eval.significance import Interval, paired_ratio_diff_ci
from sessionrl.policy.references import Context, resolve
from sessionrl.policy.toolcalls import ToolFormat, parse_reply
from sessionrl.session.model import Message


class GoldReply(Protocol):
    """One reply of a gold trajectory: the conversation it answers and the text the expert wrote."""

    @property
    def messages(self) -> Sequence[Message]: ...

    @property
    def text(self) -> str: ...


Answerer = Callable[[Sequence[Sequence[Message]]], list[str]]
"""The policy under test: the text of its reply to each conversation, in order."""

Call = tuple[str, Any]
"""A tool call as it would run: the tool's name and its arguments, references resolved."""


@dataclass(frozen=True, slots=True)
class TurnScore:
    """The verdict on one scored turn of task `task_id`."""

    task_id: str
    parsed: bool
    tool: bool
    exact: bool


@dataclass(frozen=True)
class ToolAccuracy:
    """Every scored turn's verdict, and the turns and tasks left out with their reason.

    `answers`: gold turns that answer the user (not scored). `missing`: held-out tasks without a gold
    trajectory (their expert episode did not solve them), so without scored turns. `unanswered`: scored
    turns whose conversation the policy could not take (a prompt too long for it), scored as replies
    that did not parse, as an episode counts them.
    """

    turns: tuple[TurnScore, ...]
    answers: int = 0
    missing: int = 0
    unanswered: int = 0

    @property
    def accuracy(self) -> float:
        """Share of scored turns with the right tool and the exact arguments (0 with no turn)."""
        return _share(t.exact for t in self.turns)

    @property
    def tool_rate(self) -> float:
        """Share of scored turns that call the right tool, whatever the arguments."""
        return _share(t.tool for t in self.turns)

    @property
    def parse_rate(self) -> float:
        """Share of scored turns whose reply parsed as an action."""
        return _share(t.parsed for t in self.turns)

    def by_task(self) -> dict[str, tuple[int, int]]:
        """Per task: (turns exact, turns scored).

        >>> ToolAccuracy((TurnScore("a", True, True, True), TurnScore("a", True, False, False))).by_task()
        {'a': (1, 2)}
        """
        counts: dict[str, tuple[int, int]] = {}
        for turn in self.turns:
            exact, total = counts.get(turn.task_id, (0, 0))
            counts[turn.task_id] = (exact + turn.exact, total + 1)
        return counts

    def as_dict(self) -> dict[str, float | int]:
        """The record keys: `tool_acc` (exact), `tool_name_acc`, `tool_parse_rate`, `tool_turns`,
        `tool_tasks`, `tool_answer_turns`, `tool_missing_tasks`, `tool_unanswered_turns`."""
        return {
            "tool_acc": round(self.accuracy, 4),
            "tool_name_acc": round(self.tool_rate, 4),
            "tool_parse_rate": round(self.parse_rate, 4),
            "tool_turns": len(self.turns),
            "tool_tasks": len(self.by_task()),
            "tool_answer_turns": self.answers,
            "tool_missing_tasks": self.missing,
            "tool_unanswered_turns": self.unanswered,
        }


def _share(flags: Any) -> float:
    values = list(flags)
    return sum(values) / len(values) if values else 0.0


def read_call(fmt: ToolFormat, messages: Sequence[Message], text: str) -> tuple[bool, Call | None]:
    """How an episode would read `text` as the reply to `messages`: whether it parsed, and the tool call
    it makes (its first, as an episode runs one a turn) with references resolved; None for an answer.

    >>> from sessionrl.session.model import Message
    >>> asked = [Message(role="user", content="Refund order A1")]
    >>> read_call(ToolFormat.TAGGED, asked, '<tool_call>{"name": "refund", "arguments": {"order": "A1"}}')
    (True, ('refund', {'order': 'A1'}))
    >>> read_call(ToolFormat.TAGGED, asked, "<tool_call>{oops"), read_call(ToolFormat.TAGGED, asked, "Done.")
    ((False, None), (True, None))
    """
    reply = parse_reply(fmt, text)
    if not reply.valid or not reply.tool_calls:
        return reply.valid, None
    context = Context.from_messages([*messages, Message(role="assistant", content=text)])
    call = reply.tool_calls[0]
    return True, (call.name, resolve(orjson.loads(call.arguments), context))


def gold_call(fmt: ToolFormat, gold: GoldReply) -> Call | None:
    """The tool call the expert makes at `gold` (None where it answers the user); a gold reply that does
    not parse is a bug in how it was written, and raises."""
    parsed, call = read_call(fmt, gold.messages, gold.text)
    if not parsed:
        raise ValueError(f"a gold reply does not parse in the {fmt} format: {gold.text[:200]!r}")
    return call


def score_turn(
    fmt: ToolFormat, task_id: str, gold: Call, messages: Sequence[Message], text: str
) -> TurnScore:
    """The verdict on `text`, the policy's reply to `messages`, where the expert made the call `gold`.

    >>> score = lambda text: score_turn(ToolFormat.TAGGED, "t", ("refund", {"order": "A1"}), [], text)
    >>> call = '<tool_call>{"name": "%s", "arguments": %s}</tool_call>'
    >>> score(call % ("refund", '{"order": "A1"}')).exact, score(call % ("refund", '{"order": "A2"}')).exact
    (True, False)
    """
    parsed, call = read_call(fmt, messages, text)
    tool = call is not None and call[0] == gold[0]
    return TurnScore(task_id, parsed, tool, tool and call is not None and call[1] == gold[1])


def tool_accuracy(
    tasks: Mapping[str, Sequence[GoldReply]],
    fmt: ToolFormat,
    answer: Answerer,
    *,
    batch: int = 32,
    missing: int = 0,
) -> ToolAccuracy:
    """Score the policy `answer` stands for on every tool-call turn of the gold trajectories `tasks`
    (task id → its gold replies), asking it at most `batch` conversations at a time (`asking_rounds`); the
    turns come back in trajectory order. `missing` counts the held-out tasks that have no gold trajectory
    (carried into the result)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    asked: list[tuple[str, Call, Sequence[Message]]] = []
    answers = 0
    for task_id, replies in tasks.items():
        for gold in replies:
            call = gold_call(fmt, gold)
            if call is None:
                answers += 1
            else:
                asked.append((task_id, call, gold.messages))
    scores: dict[int, TurnScore] = {}
    for chunk in asking_rounds([task_id for task_id, _, _ in asked], batch):
        texts = answer([asked[i][2] for i in chunk])
        if len(texts) != len(chunk):
            raise ValueError(f"the policy gave {len(texts)} replies to {len(chunk)} conversations")
        for i, text in zip(chunk, texts, strict=True):
            task_id, call, messages = asked[i]
            scores[i] = score_turn(fmt, task_id, call, messages, text)
    return ToolAccuracy(tuple(scores[i] for i in range(len(asked))), answers, missing)


def asking_rounds(task_ids: Sequence[str], batch: int) -> list[list[int]]:
    """The order to ask the turns in, as batches of indices into `task_ids` (the task of each turn, in
    trajectory order): tasks `batch` at a time and, among those, turn by turn (the first turn of each,
    then the second...). A task's next turn is then asked after its previous one was answered, so an
    answerer that keeps each conversation's cache (the torch engine's `KVStore`, an inference server's
    prefix cache) computes only what the gold reply and the tool's result add. Asked in trajectory
    order, a batch holding several turns of one task would compute each from the start.

    >>> asking_rounds(["a", "a", "a", "b", "c", "c"], batch=2)
    [[0, 3], [1], [2], [4], [5]]
    """
    turns: dict[str, list[int]] = {}
    for i, task_id in enumerate(task_ids):
        turns.setdefault(task_id, []).append(i)
    order = list(turns.values())
    batches: list[list[int]] = []
    for start in range(0, len(order), batch):
        group = order[start : start + batch]
        for k in range(max(len(t) for t in group)):
            batches.append([t[k] for t in group if k < len(t)])
    return batches


def accuracy_change(first: ToolAccuracy, second: ToolAccuracy, *, seed: int = 0) -> Interval:
    """`second.accuracy - first.accuracy` on the tasks both scored, with a paired bootstrap interval that
    resamples tasks.

    >>> a = ToolAccuracy((TurnScore("x", True, True, False), TurnScore("y", True, True, False)))
    >>> b = ToolAccuracy((TurnScore("x", True, True, True), TurnScore("y", True, True, False)))
    >>> accuracy_change(a, b).estimate
    0.5
    """
    mine, theirs = first.by_task(), second.by_task()
    common = sorted(mine.keys() & theirs.keys())
    return paired_ratio_diff_ci([mine[t] for t in common], [theirs[t] for t in common], seed=seed)


def pooled_change(
    first: Sequence[tuple[int, int]], second: Sequence[tuple[int, int]], *, seed: int = 0
) -> dict[str, Any]:
    """Two policies' accuracies from per-task (exact, turns) counts paired in order (the tasks of several
    runs pooled, say), and the change's paired bootstrap interval: `first`, `second`, `change`, `ci`.

    >>> pooled_change([(1, 2), (0, 2)], [(2, 2), (1, 2)])
    {'first': 0.25, 'second': 0.75, 'change': 0.5, 'ci': [0.5, 0.5]}
    """
    change = paired_ratio_diff_ci(first, second, seed=seed)
    turns = sum(n for _, n in first)
    return {
        "first": round(sum(e for e, _ in first) / turns, 4) if turns else 0.0,
        "second": round(sum(e for e, _ in second) / turns, 4) if turns else 0.0,
        "change": round(change.estimate, 4),
        "ci": change.as_list(),
    }


def paired_counts(
    first: ToolAccuracy, second: ToolAccuracy
) -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
    """Each task both scored, with its (exact, turns) under each policy: `{task: ((e1, n1), (e2, n2))}`,
    what a bench keeps per run so that runs can be pooled (`pooled_change`)."""
    mine, theirs = first.by_task(), second.by_task()
    return {t: (mine[t], theirs[t]) for t in sorted(mine.keys() & theirs.keys())}


def describe(accuracies: Mapping[str, ToolAccuracy]) -> list[str]:
    """Report lines: each policy's accuracy by label, then each later label's change against the first,
    with its paired interval.

    >>> right, wrong = TurnScore("a", True, True, True), TurnScore("a", True, False, False)
    >>> each, change = describe({"sft": ToolAccuracy((wrong, right)), "rl": ToolAccuracy((right, right))})
    >>> each.split(": ")[1]
    'sft 0.500 (tool 0.50, parsed 1.00) · rl 1.000 (tool 1.00, parsed 1.00)'
    >>> change
    'tool accuracy rl - sft: +0.500 [+0.500, +0.500] (paired bootstrap over tasks)'
    """
    if not accuracies:
        return []
    first_label, first = next(iter(accuracies.items()))
    size = f"{len(first.turns)} turns of {len(first.by_task())} tasks"
    if first.missing:
        size += f"; {first.missing} tasks without a gold trajectory"
    each = " · ".join(
        f"{label} {a.accuracy:.3f} (tool {a.tool_rate:.2f}, parsed {a.parse_rate:.2f})"
        for label, a in accuracies.items()
    )
    lines = [f"tool accuracy (teacher-forced on the expert's tool calls; {size}): {each}"]
    for label, later in list(accuracies.items())[1:]:
        change = accuracy_change(first, later)
        lines.append(
            f"tool accuracy {label} - {first_label}: {change.estimate:+.3f}"
            f" [{change.low:+.3f}, {change.high:+.3f}] (paired bootstrap over tasks)"
        )
    return lines


__all__ = [
    "Answerer",
    "GoldReply",
    "ToolAccuracy",
    "TurnScore",
    "accuracy_change",
    "asking_rounds",
    "describe",
    "gold_call",
    "paired_counts",
    "pooled_change",
    "read_call",
    "score_turn",
    "tool_accuracy",
]
