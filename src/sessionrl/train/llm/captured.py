"""Captured sessions as training sequences, after an integrity check that says why each dropped one went.

A captured session trains on what its model wrote, never on what its tools answered. When its LLM calls
carry the token ids the model sampled (the gateway's own policy records them), those exact ids are used
(`policy_turns`), with their log-probabilities; otherwise each call's conversation goes through the
policy's chat template and its reply is tokenised (`ChatEncoder`), both written in the tool-call format of
the policy being trained (`toolcalls.tool_format_of` the encoder) as the gateway's `PolicyChat` reads and
writes it: in the action language a tool call is `{"tool": ..., "params": ...}` and an answer
`{"final": ...}`; a pretrained model's calls are `<tool_call>` JSON and its answers plain text. Failed
model calls are left out.

A captured session whose metadata names its environment's task (`task_id`, and `env` when given: the
gateway keeps the metadata of the request that opened the session) lets GRPO replay that task
(`replayable_tasks`): only training tasks, and only when the task's instruction is the session's query, so
a task id read against an environment built with other settings is never mistaken for another task.

The check, per session: every recorded call's tokens and log-probabilities line up; every sequence's ids,
loss mask and log-probabilities have one length; the mask covers exactly the model's own tokens; and no
trained reply repeats a tool's output. A session failing any of these is dropped whole, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from sessionrl.envs.base import DecisionEnv, Split, Task
from sessionrl.gateway.backends import conversation_context, policy_view
from sessionrl.policy.references import Context, abstract
from sessionrl.policy.toolcalls import ToolFormat, tool_format_of, write_call, write_final
from sessionrl.session.model import CallStatus, LLMCall, Session
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.train.llm.data import ChatEncoder, TokenSequence, Turn, merge_turns, policy_turns

MIN_TOOL_TEXT = 12
"""Shortest tool output text looked for in trained replies (shorter ones match by chance)."""


@dataclass
class CapturedData:
    """The sequences to train on, the sessions they came from, and each dropped session with its reason."""

    sequences: list[TokenSequence] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)


def stored_sessions(db_url: str, filters: Mapping[str, Any], limit: int = 10_000) -> list[Session]:
    """The sessions of the store at `db_url` that the typed filters of `sessions query` select (such as
    `{"tags": ["gateway"], "tool_share": "crp_test_request<0.3"}`), oldest first."""
    query = SessionQuery.model_validate({**filters, "limit": limit})
    with SessionStore.open(db_url) as store:
        return [store.get(row.session_id) for row in store.query(query)]


class Unfit(Exception):
    """Why a session cannot be trained on."""


def captured_sequences(sessions: Sequence[Session], encoder: ChatEncoder) -> CapturedData:
    """Every session that passes the check, as sequences; the others, with their reasons."""
    data = CapturedData()
    for session in sessions:
        try:
            sequences = session_sequences(session, encoder)
        except Unfit as exc:
            data.dropped.append((session.session_id, str(exc)))
            continue
        data.sequences += sequences
        data.kept.append(session.session_id)
    return data


def session_sequences(session: Session, encoder: ChatEncoder) -> list[TokenSequence]:
    """The session's sequences, checked; `Unfit` says why it cannot be trained on."""
    calls = [c for c in session.llm_calls if c.status is CallStatus.SUCCESS]
    if not calls:
        raise Unfit("no successful model call to learn from")
    for call in calls:
        check_call(call)
    tokened = [c for c in calls if c.prompt_token_ids is not None and c.token_ids]
    if tokened and len(tokened) != len(calls):
        raise Unfit("some model calls carry token ids and others do not; a session trains one way")
    if tokened:
        turns = policy_turns(session, {})
    else:
        check_no_tool_output(session, [c.response for c in calls])
        turns = [template_turn(c, encoder) for c in calls]
    sequences = merge_turns(turns, session.session_id)
    check_sequences(sequences, turns)
    return sequences


def check_call(call: LLMCall) -> None:
    """A call's recorded tokens line up: log-probabilities one per completion token, none without ids."""
    if call.logprobs is not None and call.token_ids is None:
        raise Unfit(f"call {call.call_id}: log-probabilities without the token ids they belong to")
    if call.token_ids is not None and call.prompt_token_ids is None:
        raise Unfit(f"call {call.call_id}: completion token ids without the prompt's")
    if call.logprobs is not None and call.token_ids is not None and len(call.logprobs) != len(call.token_ids):
        raise Unfit(
            f"call {call.call_id}: {len(call.logprobs)} log-probabilities for {len(call.token_ids)} tokens"
        )
    if not call.messages:
        raise Unfit(f"call {call.call_id}: no messages, so no prompt to train against")


def reply_text(call: LLMCall, fmt: ToolFormat = ToolFormat.ACTION) -> str:
    """What the model wrote, in the tool-call format `fmt`: its first tool call, or its answer. In the
    action language, values the call's conversation already holds are written as references
    (`references.abstract` against the gateway's `conversation_context`), as the demonstrations write
    them and as the gateway resolves them when the trained policy is served."""
    said = conversation_context(call.messages) if fmt is ToolFormat.ACTION else Context.of("", ())
    if call.tool_calls:
        first = call.tool_calls[0]
        try:
            params = orjson.loads(first.arguments)
        except orjson.JSONDecodeError:
            raise Unfit(f"call {call.call_id}: tool call arguments are not JSON") from None
        arguments = params if isinstance(params, dict) else {"arguments": params}
        return write_call(fmt, first.name, abstract(arguments, said))
    return write_final(fmt, abstract(call.response, said))


def template_turn(call: LLMCall, encoder: ChatEncoder) -> Turn:
    """A call without recorded tokens, through the chat template, in the encoder's tool-call format."""
    fmt = tool_format_of(encoder)
    prompt = encoder.encode_prompt([policy_view(m, fmt) for m in call.messages])
    return Turn(tuple(prompt), tuple(encoder.encode_reply(reply_text(call, fmt))))


def check_no_tool_output(session: Session, replies: Sequence[str]) -> None:
    """No trained reply repeats a tool's output (an agent that logged tool results as model text)."""
    for call in session.tool_calls:
        if call.output is None:
            continue
        text = call.output if isinstance(call.output, str) else orjson.dumps(call.output).decode()
        if len(text) >= MIN_TOOL_TEXT and any(text in reply for reply in replies):
            raise Unfit(f"a model reply repeats the output of tool call {call.call_id}")


def check_sequences(sequences: Sequence[TokenSequence], turns: Sequence[Turn]) -> None:
    """Ids, mask and log-probabilities have one length, and the mask covers exactly the model's tokens."""
    for seq in sequences:
        if not len(seq.input_ids) == len(seq.loss_mask) == len(seq.old_logprobs) == len(seq.advantages):
            raise Unfit("a sequence's ids, loss mask and log-probabilities differ in length")
    trained = sum(seq.policy_tokens for seq in sequences)
    produced = sum(len(t.completion) for t in turns)
    if trained != produced:
        raise Unfit(f"the loss mask covers {trained} tokens but the model produced {produced}")
    if produced == 0:
        raise Unfit("the model's replies are empty")


TASK_KEY = "task_id"
"""The session metadata key naming the environment's task the session worked on."""
ENV_KEY = "env"
"""The session metadata key naming that task's environment."""


@dataclass
class Replay:
    """The tasks captured sessions let an environment replay, and each session skipped with its reason."""

    tasks: list[Task] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def replayable_tasks(sessions: Sequence[Session], env: DecisionEnv, env_name: str) -> Replay:
    """The training tasks of `env` (registered as `env_name`) that the sessions name, each once, in the
    order first named; a session whose task cannot be replayed is skipped with the reason (`why_not`)."""
    tasks = {t.task_id: (split, t) for split in Split for t in env.tasks(split)}
    replay, seen = Replay(), set()
    for session in sessions:
        reason = why_not(session, tasks, env_name)
        if reason is not None:
            replay.skipped.append((session.session_id, reason))
            continue
        task = tasks[session.metadata[TASK_KEY]][1]
        if task.task_id not in seen:
            seen.add(task.task_id)
            replay.tasks.append(task)
    return replay


def why_not(session: Session, tasks: Mapping[str, tuple[Split, Task]], env_name: str) -> str | None:
    """Why `session` cannot replay a task of `tasks` (the environment's, by id, with their splits): it
    names none, names another environment, a task not there or outside the training split, or a task
    whose instruction is not the session's query; None when it can."""
    task_id, named_env = session.metadata.get(TASK_KEY), session.metadata.get(ENV_KEY)
    if not isinstance(task_id, str):
        return f"its metadata names no {TASK_KEY}"
    if named_env is not None and named_env != env_name:
        return f"it ran in environment {named_env!r}, not {env_name!r}"
    if task_id not in tasks:
        return f"{env_name} has no task {task_id!r}"
    split, task = tasks[task_id]
    if split is not Split.TRAIN:
        return f"task {task_id} is in the {split.value} split; only training tasks are replayed"
    if task.instruction != session.user_query:
        return f"task {task_id} here is not the task it captured (another instruction)"
    return None
