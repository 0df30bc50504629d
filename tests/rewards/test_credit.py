"""Per-call credit terms on a hand-made session: which calls used an expected tool and which passed a value
an earlier result held, and the dense rule file that switches them on, scored call by call."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sessionrl.rewards import check_reward_term, load_rules, sample_sessions
from sessionrl.rewards.checker import default_context
from sessionrl.rewards.credit import reads_results, right_tool
from sessionrl.rewards.engine import RewardConfig, RewardEngine
from sessionrl.session import (
    Feedback,
    FeedbackAdded,
    FeedbackType,
    SessionCreate,
    ToolCall,
    ToolCallRecorded,
    created,
    fold,
)
from sessionrl.session.model import CallStatus, Session

DENSE = Path(__file__).resolve().parents[2] / "examples" / "rewards" / "dense_credit.yaml"
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def call(i: int, tool: str, params: dict[str, Any], output: Any, ok: bool = True) -> ToolCall:
    status = CallStatus.SUCCESS if ok else CallStatus.ERROR
    code = None if ok else "INVALID_PARAMS"
    at = T0 + timedelta(seconds=i)
    return ToolCall(
        call_id=f"c{i}",
        tool=tool,
        params=params,
        output=output,
        status=status,
        error_code=code,
        started_at=at,
    )


def ticket(metadata: dict[str, Any]) -> Session:
    """Order A7's waybill sent by SMS: a lookup, a wrong tool, the SMS with the waybill read from the first
    result, and a call whose only value the request already named."""
    calls = [
        call(0, "waybill_generate", {"order": "A7"}, {"id": "W-9001", "n": 1}),
        call(1, "refund", {"order": "A7"}, None, ok=False),
        call(2, "sms_send", {"phone": "5550100", "text": "waybill W-9001"}, {"sent": True}),
        call(3, "sms_send", {"phone": "5550100", "text": "A7"}, {"sent": True}),
    ]
    query = "Send the waybill of order A7 to 5550100."
    events: list[Any] = [created(SessionCreate(user_query=query, metadata=metadata))]
    events += [ToolCallRecorded(call=c) for c in calls]
    events.append(FeedbackAdded(feedback=Feedback(type=FeedbackType.TASK_OUTCOME, score=1.0)))
    return fold(events)


EXPECTED = {"expected_tools": ["waybill_generate", "sms_send"]}


def test_right_tool_credits_expected_tools_and_charges_the_others() -> None:
    result = right_tool(ticket(EXPECTED), default_context())
    assert result.steps == {"c0": 1.0, "c1": -1.0, "c2": 1.0, "c3": 1.0}
    assert result.value == 2.0
    assert right_tool(ticket({}), default_context()).steps == {}


def test_reads_results_credits_only_values_an_earlier_result_held_that_the_request_did_not() -> None:
    # c2's text is not a value of c0's output, W-9001 is: a value counts whole, so c2 is not credited;
    # c3's "A7" is in the request. Only a call passing W-9001 itself would be.
    session = ticket(EXPECTED)
    assert reads_results(session, default_context()).steps == {}
    read = session.model_copy(
        update={"tool_calls": (*session.tool_calls[:2], call(2, "sms_send", {"text": "W-9001"}, None))}
    )
    assert reads_results(read, default_context()).steps == {"c2": 1.0}


def test_the_credit_terms_conform() -> None:
    for fn in (right_tool, reads_results):
        check_reward_term(fn, sample_sessions(12))


def test_the_dense_rule_file_scores_each_call_by_hand() -> None:
    rules = load_rules(DENSE)
    assert {t.name for t in rules.terms} >= {"right_tool", "reads_results", "recovery"}
    engine = RewardEngine(RewardConfig(rules=DENSE, learn=False))
    vector = engine.score(ticket(EXPECTED), learn=False)
    # right tool +1, valid arguments +0.25, success +0.25; the failed call: wrong tool -1, policy error -1
    assert vector.step_rewards["c0"] == pytest.approx(1.5)
    assert vector.step_rewards["c1"] == pytest.approx(-2.0)
    assert vector.layers["completion"].raw == pytest.approx(1.5 - 2.0 + 1.5 + 1.5)
    assert vector.layers["long_term"].raw == pytest.approx(1.0)  # the outcome GRPO ranks a group by
