"""Preference pairs from outcomes: where a solved and an unsolved episode part, what is stored, and that the
stored pairs read back through the DPO convention."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from sessionrl.envs.base import Split
from sessionrl.episodes import EpisodeSpec, expert, run_episodes
from sessionrl.orchestrator.policy import ScriptedBackend
from sessionrl.policy.toolcalls import ToolFormat, write_call
from sessionrl.session import FeedbackAdded, LLMCallRecorded, SessionCreate
from sessionrl.session.model import LLMCall, Message, Session
from sessionrl.store import SessionStore
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.data import Reply
from sessionrl.train.llm.dpo import stored_preferences
from sessionrl.train.llm.preferences import ANNOTATOR, outcome_preferences, sample_pairs
from sessionrl.train.llm.run import open_run

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


class TaggedScript(ScriptedBackend):
    """Replies as a pretrained model without tool support writes them (`ToolFormat.TAGGED`)."""

    tool_format = ToolFormat.TAGGED


@dataclass
class TaggedPolicy:
    """What `sample_pairs` asks of the run's policy: its version, its format and a sampling view."""

    script: list[str]
    version: int = 0
    tool_format: ToolFormat = ToolFormat.TAGGED

    def view(self, sampling: object) -> TaggedScript:
        return TaggedScript(self.script)


def test_the_experts_replies_are_written_in_the_policys_format(tmp_path: Path) -> None:
    config = RunConfig.model_validate(
        {
            "run_dir": tmp_path / "run",
            "trainer": "dpo",
            "env": {"train": 4, "dev": 1, "test": 1},
            "dpo": {"tasks": 1, "episodes_per_task": 1},
        }
    )
    with open_run(config) as run:
        task = run.env.tasks(Split.TRAIN)[0]
        spec = EpisodeSpec(task, "demo")
        asyncio.run(run_episodes(run.env, [spec], expert(run.env), run.store, config.rollout))
        demo = run.store.get("demo")
        first, second = demo.tool_calls[:2]
        # the loser begins as the expert does, then gives up: it parts from the demonstration at its 2nd call
        run.policy = TaggedPolicy([write_call(ToolFormat.TAGGED, first.tool, first.params), "I cannot."])  # type: ignore[assignment]
        assert config.dpo is not None
        assert sample_pairs(run, config.dpo, [demo]) == 1
        loser = run.store.get(f"dpo-0-{task.task_id}")
    (preference,) = [f for f in loser.feedback if f.annotator == ANNOTATOR]
    assert preference.data["chosen"] == write_call(ToolFormat.TAGGED, second.tool, second.params)
    assert preference.data["rejected_call_id"] == loser.llm_calls[1].call_id
