"""Preference pairs from outcomes: where a solved and an unsolved episode part, what is stored, and that the
stored pairs read back through the DPO convention."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from sessionrl.session import FeedbackAdded, LLMCallRecorded, SessionCreate
from sessionrl.session.model import LLMCall, Message, Session
from sessionrl.store import SessionStore
from sessionrl.train.llm.data import Reply
from sessionrl.train.llm.dpo import stored_preferences
from sessionrl.train.llm.preferences import ANNOTATOR, outcome_preferences

ASK = (Message(role="system", content="Answer in JSON."), Message(role="user", content="Is SKU-1 in stock?"))
CHECK = '{"tool": "inventory_check", "params": {"sku": "SKU-1"}}'
SEEN = Message(role="tool", content="in stock: 4")


def after(*replies: str) -> tuple[Message, ...]:
    """The conversation after `replies`, each answered by the same tool message."""
    turns = [m for r in replies for m in (Message(role="assistant", content=r), SEEN)]
    return (*ASK, *turns)


@pytest.fixture
def store() -> Iterator[SessionStore]:
    with SessionStore.open("sqlite://") as opened:
        yield opened


def episode(store: SessionStore, sid: str, calls: Sequence[tuple[tuple[Message, ...], str]]) -> Session:
    """A stored session holding one LLM call per (messages, response)."""
    store.create(SessionCreate(user_query=ASK[1].content, session_id=sid))
    for i, (messages, response) in enumerate(calls):
        call = LLMCall(call_id=f"{sid}-l{i}", purpose="act", messages=messages, response=response)
        store.append(sid, LLMCallRecorded(call=call))
    return store.get(sid)


def test_a_loser_is_paired_where_it_first_parts_from_the_first_winner_it_parts_from(
    store: SessionStore,
) -> None:
    expert = [Reply(ASK, CHECK), Reply(after(CHECK), '{"finish": "yes, 4 in stock"}')]
    solved = episode(store, "won", [(ASK, CHECK), (after(CHECK), '{"finish": "4 left"}')])
    # the same first reply as both winners, then another answer: it parts from `won` at its second call
    late = episode(store, "late", [(ASK, CHECK), (after(CHECK), '{"finish": "no"}')])
    # answers at once: it parts from `won` at its first call
    early = episode(store, "early", [(ASK, '{"finish": "no"}')])
    winners = [("won", [Reply(c.messages, c.response) for c in solved.llm_calls]), ("demo", expert)]
    pairs = dict(outcome_preferences(winners, [late, early]))
    assert pairs["late"].data == {
        "chosen": '{"finish": "4 left"}',
        "rejected_call_id": "late-l1",
        "chosen_session": "won",
    }
    assert pairs["early"].data["chosen"] == CHECK
    assert pairs["early"].data["rejected_call_id"] == "early-l0"
    assert all(f.annotator == ANNOTATOR for f in pairs.values())


def test_no_pair_where_the_conversations_differ_before_the_replies_do(store: SessionStore) -> None:
    """The loser's second prompt holds another tool answer (a fault, say): nothing tells which reply to the
    second prompt was better, and the first replies agree."""
    other = (*ASK, Message(role="assistant", content=CHECK), Message(role="tool", content="timeout"))
    lost = episode(store, "lost", [(ASK, CHECK), (other, '{"finish": "no"}')])
    winners = [("demo", [Reply(ASK, CHECK), Reply(after(CHECK), '{"finish": "yes"}')])]
    assert outcome_preferences(winners, [lost]) == []
    same = episode(store, "same", [(ASK, CHECK)])  # never parts: it stopped where the winner went on
    assert outcome_preferences(winners, [same]) == []


def test_stored_pairs_read_back_as_preferences(store: SessionStore) -> None:
    lost = episode(store, "lost", [(ASK, '{"finish": "no"}')])
    for sid, feedback in outcome_preferences([("demo", [Reply(ASK, CHECK)])], [lost]):
        store.append(sid, FeedbackAdded(feedback=feedback))
    (preference,) = stored_preferences(store)
    assert (preference.messages, preference.chosen, preference.rejected) == (ASK, CHECK, '{"finish": "no"}')
