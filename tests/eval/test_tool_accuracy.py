"""Per-turn tool accuracy on hand-made gold trajectories: a right call, a wrong tool, wrong arguments and a
reply that does not parse, each scored as worked out by hand; references resolve before the comparison."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from sessionrl.eval.tool_accuracy import (
    ToolAccuracy,
    TurnScore,
    accuracy_change,
    asking_rounds,
    score_turn,
    tool_accuracy,
)
from sessionrl.policy.toolcalls import ToolFormat
from sessionrl.session.model import Message


@dataclass(frozen=True)
class Gold:
    messages: tuple[Message, ...]
    text: str


ASK = (Message(role="user", content="Send the waybill of order A7 to 5550100."),)
LOOKED_UP = (
    *ASK,
    Message(role="assistant", content='{"tool":"waybill_generate","params":{"order":"A7"}}'),
    Message(role="tool", content='{"tool":"waybill_generate","ok":true,"output":{"id":"W-9"}}'),
)
GOLD = {
    "t1": [
        Gold(ASK, '{"tool":"waybill_generate","params":{"order":"A7"}}'),
        Gold(LOOKED_UP, '{"tool":"sms_send","params":{"phone":"5550100","text":"W-9"}}'),
        Gold((*LOOKED_UP, Message(role="assistant", content="x")), '{"final":"Sent."}'),
    ],
    "t2": [Gold(ASK, '{"tool":"waybill_generate","params":{"order":"A7"}}')],
}


def scripted(replies: Sequence[str]) -> tuple[list[list[Message]], object]:
    """An answerer that gives `replies` in order, and the conversations it was asked."""
    asked: list[list[Message]] = []
    queue = list(replies)

    def answer(conversations: Sequence[Sequence[Message]]) -> list[str]:
        asked.extend(list(c) for c in conversations)
        return [queue.pop(0) for _ in conversations]

    return asked, answer


def test_each_kind_of_reply_is_scored_as_worked_out_by_hand() -> None:
    replies = [  # asked turn by turn: the first turns of t1 and t2, then t1's second
        '{"tool":"waybill_generate","params":{"order":"A7"}}',  # right tool, exact arguments (t1)
        '{"tool":"refund","params":{"order":"A7"}}',  # wrong tool (t2)
        '{"tool":"sms_send","params":{"phone":"5550100","text":"W-8"}}',  # right tool, wrong argument (t1)
    ]
    asked, answer = scripted(replies)
    result = tool_accuracy(GOLD, ToolFormat.ACTION, answer, batch=2)  # type: ignore[arg-type]
    assert [c[-1].content for c in asked] == [ASK[0].content, ASK[0].content, LOOKED_UP[-1].content]
    assert result.turns == (
        TurnScore("t1", parsed=True, tool=True, exact=True),
        TurnScore("t1", parsed=True, tool=True, exact=False),
        TurnScore("t2", parsed=True, tool=False, exact=False),
    )
    assert result.answers == 1  # the final answer of t1 is not scored
    assert result.accuracy == pytest.approx(1 / 3)
    assert result.tool_rate == pytest.approx(2 / 3)
    assert result.as_dict()["tool_turns"] == 3
    assert result.by_task() == {"t1": (1, 2), "t2": (0, 1)}


def test_a_reference_to_an_earlier_result_counts_as_the_value_it_names() -> None:
    gold = GOLD["t1"][1]
    by_reference = '{"tool":"sms_send","params":{"phone":"5550100","text":"{{waybill_generate.id}}"}}'
    score = score_turn(
        ToolFormat.ACTION,
        "t1",
        ("sms_send", {"phone": "5550100", "text": "W-9"}),
        gold.messages,
        by_reference,
    )
    assert score.exact


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_a_tasks_next_turn_is_asked_only_after_its_previous_one(batch: int) -> None:
    task_ids = [t for t, n in zip("abcdefg", [5, 1, 3, 3, 7, 2, 4], strict=True) for _ in range(n)]
    batches = asking_rounds(task_ids, batch)
    assert sorted(i for b in batches for i in b) == list(range(len(task_ids)))  # each turn once
    assert all(0 < len(b) <= batch for b in batches)
    assert all(len({task_ids[i] for i in b}) == len(b) for b in batches)  # no task twice in a batch
    asked_at = {i: n for n, b in enumerate(batches) for i in b}
    for earlier, later in itertools.pairwise(range(len(task_ids))):
        if task_ids[earlier] == task_ids[later]:
            assert asked_at[earlier] < asked_at[later]


def test_an_unparseable_reply_and_an_answer_instead_of_a_call_score_nothing() -> None:
    call = ("sms_send", {"phone": "5550100"})
    broken = score_turn(ToolFormat.TAGGED, "t", call, ASK, '<tool_call>{"name": "sms_send", "argu')
    answered = score_turn(ToolFormat.TAGGED, "t", call, ASK, "I sent it.")
    assert broken == TurnScore("t", parsed=False, tool=False, exact=False)
    assert answered == TurnScore("t", parsed=True, tool=False, exact=False)


def test_a_gold_reply_that_does_not_parse_is_refused() -> None:
    _, answer = scripted([])
    with pytest.raises(ValueError, match="gold reply does not parse"):
        tool_accuracy({"t": [Gold(ASK, "not json")]}, ToolFormat.ACTION, answer)  # type: ignore[arg-type]


def test_the_paired_change_resamples_tasks_both_policies_were_scored_on() -> None:
    right, wrong = TurnScore("a", True, True, True), TurnScore("a", True, True, False)
    first = ToolAccuracy((wrong, wrong, TurnScore("b", True, True, True)))
    second = ToolAccuracy((right, right, TurnScore("b", True, True, True), TurnScore("c", True, True, True)))
    change = accuracy_change(first, second)
    assert change.estimate == pytest.approx(3 / 3 - 1 / 3)  # task c is left out: first never saw it
    assert change.low <= change.estimate <= change.high
    assert ToolAccuracy(()).accuracy == 0.0
