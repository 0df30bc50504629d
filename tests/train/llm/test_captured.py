"""Captured sessions as training sequences: recorded tokens used as they are, the chat template otherwise,
and each session that fails the integrity check dropped with its reason; the tasks they let GRPO replay."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sessionrl.envs.base import Split
from sessionrl.envs.registry import build
from sessionrl.policy.toolcalls import ToolFormat
from sessionrl.session import SessionCreate, created
from sessionrl.session.model import CallStatus, LLMCall, Message, Session, ToolCall, ToolRequest
from sessionrl.store import SessionStore
from sessionrl.train.llm.captured import captured_sequences, replayable_tasks, stored_sessions
from sessionrl.train.llm.data import TokenSequence

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ASK = (Message(role="user", content="where is O-1?"),)


class CharEncoder:
    """One id per character: prompts are the joined contents, replies end with id 0."""

    def encode_prompt(self, messages: Sequence[Message]) -> list[int]:
        return [ord(ch) for m in messages for ch in m.content]

    def encode_reply(self, text: str) -> list[int]:
        return [ord(ch) for ch in text] + [0]


def session(sid: str, llm: Sequence[LLMCall], tools: Sequence[ToolCall] = ()) -> Session:
    return Session(
        session_id=sid,
        trace_id="0" * 32,
        user_query="where is O-1?",
        llm_calls=tuple(llm),
        tool_calls=tuple(tools),
        created_at=NOW,
        updated_at=NOW,
    )


def call(call_id: str, **fields: Any) -> LLMCall:
    return LLMCall(call_id=call_id, messages=ASK, **fields)


def test_recorded_tokens_are_trained_as_sampled_and_only_the_model_s_own() -> None:
    first = call("a", prompt_token_ids=(1, 2), token_ids=(3,), logprobs=(-0.5,))
    second = call("b", prompt_token_ids=(1, 2, 3, 9, 9), token_ids=(4, 5), logprobs=(-0.1, -0.2))
    data = captured_sequences([session("s1", [first, second])], CharEncoder())
    (seq,) = data.sequences
    assert seq.input_ids == (1, 2, 3, 9, 9, 4, 5)  # 9, 9: the tool's answer, in the prompt
    assert seq.loss_mask == (False, False, True, False, False, True, True)
    assert seq.old_logprobs == (0.0, 0.0, -0.5, 0.0, 0.0, -0.1, -0.2)
    assert (data.kept, data.dropped) == (["s1"], [])


def test_without_tokens_replies_are_written_in_the_policy_s_action_language() -> None:
    asked = call("a", tool_calls=(ToolRequest(id="c1", name="lookup", arguments='{"id": "O-2"}'),))
    answered = call("b", response="shipped")
    data = captured_sequences([session("s2", [asked, answered])], CharEncoder())
    assert trained_texts(data.sequences) == ['{"tool":"lookup","params":{"id":"O-2"}}', '{"final":"shipped"}']


def test_without_tokens_values_the_conversation_holds_are_written_as_references() -> None:
    ask = Message(role="user", content="where is order O-17?")
    lookup = ToolRequest(id="c1", name="lookup", arguments='{"id": "O-17"}')
    looked = (ask, Message(role="assistant", content="", tool_calls=(lookup,)))
    result = Message(role="tool", content='{"waybill": "SF123"}', tool_call_id="c1")
    asked = LLMCall(call_id="a", messages=(ask,), tool_calls=(lookup,))
    answered = LLMCall(call_id="b", messages=(*looked, result), response="O-17 ships as SF123.")
    data = captured_sequences([session("s3", [asked, answered])], CharEncoder())
    assert trained_texts(data.sequences) == [
        '{"tool":"lookup","params":{"id":"{{user.order}}"}}',
        '{"final":"{{user.order}} ships as {{lookup.waybill}}."}',
    ]


def trained_texts(sequences: Sequence[TokenSequence]) -> list[str]:
    """The texts a CharEncoder's sequences train on (their masked characters)."""
    return [
        "".join(chr(i) for i, m in zip(seq.input_ids, seq.loss_mask, strict=True) if m and i)
        for seq in sequences
    ]


class TaggedCharEncoder(CharEncoder):
    """The same encoder for a policy that writes `<tool_call>` JSON (a pretrained model's format)."""

    tool_format = ToolFormat.TAGGED


def test_without_tokens_replies_and_past_calls_are_written_in_the_trained_policy_s_format() -> None:
    lookup = ToolRequest(id="c1", name="lookup", arguments='{"id": "O-1"}')
    asked = call("a", tool_calls=(lookup,))
    seen = (
        *ASK,
        Message(role="assistant", content="", tool_calls=(lookup,)),
        Message(role="tool", content="ok"),
    )
    answered = LLMCall(call_id="b", messages=seen, response="shipped")
    data = captured_sequences([session("s3", [asked, answered])], TaggedCharEncoder())
    texts = ["".join(chr(i) if i else "|" for i in seq.input_ids) for seq in data.sequences]
    call_text = '<tool_call>{"name":"lookup","arguments":{"id":"O-1"}}</tool_call>'
    # the reply, then the past call in the next prompt, each as the trained policy writes it
    assert texts == [f"where is O-1?{call_text}|", f"where is O-1?{call_text}okshipped|"]


def test_sessions_that_fail_the_check_are_dropped_each_with_its_reason() -> None:
    failed = call("a", status=CallStatus.ERROR, error_message="503")
    orphan_logprobs = LLMCall.model_construct(
        call_id="b", messages=ASK, token_ids=None, prompt_token_ids=None, logprobs=(-0.1,),
        status=CallStatus.SUCCESS, tool_calls=(), response="x",
    )  # fmt: skip
    output = {"status": "shipped", "eta": "tomorrow"}
    tool = ToolCall(call_id="c1", tool="lookup", output=output, status=CallStatus.SUCCESS)
    parrot = call("c", response='The tool said {"status":"shipped","eta":"tomorrow"}')
    mixed = [call("d", prompt_token_ids=(1,), token_ids=(2,)), call("e", response="hi")]
    sessions = [
        session("only-failed", [failed]),
        session("orphan", [orphan_logprobs]),
        session("parrot", [parrot], [tool]),
        session("mixed", mixed),
        session("fine", [call("f", response="ok")]),
    ]
    data = captured_sequences(sessions, CharEncoder())
    assert data.kept == ["fine"]
    reasons = dict(data.dropped)
    assert reasons["only-failed"] == "no successful model call to learn from"
    assert "log-probabilities without the token ids" in reasons["orphan"]
    assert "repeats the output of tool call c1" in reasons["parrot"]
    assert "trains one way" in reasons["mixed"]


def test_stored_sessions_are_selected_with_the_typed_filters(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    with SessionStore.open(url) as store:
        for sid, tag in (("a", "gateway"), ("b", "other"), ("c", "gateway")):
            store.append(sid, created(SessionCreate(user_query="q", session_id=sid, tags=(tag,))))
    assert [s.session_id for s in stored_sessions(url, {"tags": ["gateway"]})] == ["a", "c"]
    assert [s.session_id for s in stored_sessions(url, {}, limit=1)] == ["a"]


def test_only_training_tasks_the_environment_really_has_are_replayed() -> None:
    env = build("orders", train=4, dev=1, test=1)
    first, second = env.tasks(Split.TRAIN)[:2]
    held_out = env.tasks(Split.TEST)[0]

    def captured(sid: str, query: str, **metadata: str) -> Session:
        return Session(
            session_id=sid, trace_id="0" * 32, user_query=query, metadata=metadata,
            created_at=NOW, updated_at=NOW,
        )  # fmt: skip

    sessions = [
        captured("a", first.instruction, env="orders", task_id=first.task_id),
        captured("again", first.instruction, task_id=first.task_id),
        captured("b", second.instruction, env="orders", task_id=second.task_id),
        captured("none", "hi"),
        captured("retail", first.instruction, env="retail", task_id=first.task_id),
        captured("test", held_out.instruction, task_id=held_out.task_id),
        captured("other", "another question", task_id=second.task_id),
        captured("missing", "q", task_id="orders-train-9999"),
    ]
    replay = replayable_tasks(sessions, env, "orders")
    assert [t.task_id for t in replay.tasks] == [first.task_id, second.task_id]
    reasons = dict(replay.skipped)
    assert reasons == {
        "none": "its metadata names no task_id",
        "retail": "it ran in environment 'retail', not 'orders'",
        "test": f"task {held_out.task_id} is in the test split; only training tasks are replayed",
        "other": f"task {second.task_id} here is not the task it captured (another instruction)",
        "missing": "orders has no task 'orders-train-9999'",
    }
