"""The policy seen from the orchestrator: messages in, text (and, for our own models, tokens) out.

A `PolicyBackend` is one inference instance. The engine keeps several and routes each session to the same
one (see `sessionrl.orchestrator.lanes.route`), so a backend with a prompt cache sees a session's growing
conversation every time. `ScriptedBackend` replays canned replies, for tests and demos.

Policy text is read as JSON: a plan (`parse_plan`) or a tool call (`parse_tool_call`). Models often wrap
JSON in prose or a code fence, so the outermost `{...}` of the text is what is parsed.

>>> parse_tool_call('Sure: {"tool": "find_order", "params": {"id": 7}}')
ToolChoice(tool='find_order', params={'id': 7}, subgoal_id=None)
>>> parse_plan("no plan here") is None
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sessionrl.errors import SessionRLError
from sessionrl.session.model import Message, Plan, Session
from sessionrl.skills.contract import SkillContract


class PolicyError(SessionRLError):
    """A backend could not answer (unreachable, overloaded, out of replies): the step fails unrecorded.

    `retryable` is False when asking again cannot help: no backend is configured, or the version a
    session is routed to does not load."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class PolicyReply(BaseModel):
    """What one policy call produced. Token ids and logprobs are present when the policy is ours."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    prompt_token_ids: tuple[int, ...] | None = None
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    policy_version: int | None = None
    tokens_used: int = Field(default=0, ge=0)


@runtime_checkable
class PolicyBackend(Protocol):
    """One inference instance of the policy."""

    async def generate(self, messages: Sequence[Message], *, purpose: str) -> PolicyReply:
        """Answer the conversation; `purpose` is `plan`, `act` or `step`. Raise `PolicyError` on failure."""
        ...


class ScriptedBackend:
    """Answers with canned replies, one per call, in order; raises `PolicyError` once they run out.

    >>> import asyncio
    >>> backend = ScriptedBackend(["hello"], policy_version=3)
    >>> asyncio.run(backend.generate([], purpose="step")).policy_version
    3
    """

    def __init__(
        self, replies: Sequence[str | PolicyReply] = (), *, policy_version: int | None = None
    ) -> None:
        self._replies = [
            r if isinstance(r, PolicyReply) else PolicyReply(text=r, policy_version=policy_version)
            for r in replies
        ]
        self._next = 0
        self.calls: list[tuple[tuple[Message, ...], str]] = []
        """Every conversation this backend was asked to answer, with its purpose."""

    async def generate(self, messages: Sequence[Message], *, purpose: str) -> PolicyReply:
        """The next canned reply."""
        self.calls.append((tuple(messages), purpose))
        if self._next >= len(self._replies):
            raise PolicyError(f"scripted backend has no reply left after {len(self._replies)}")
        reply = self._replies[self._next]
        self._next += 1
        return reply


class ToolChoice(BaseModel):
    """A tool call the policy chose: which skill, with which parameters, for which sub-goal."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)
    subgoal_id: str | None = None


def _json_object(text: str) -> Any:
    """The outermost `{...}` of `text` decoded as JSON, or None when there is none."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        return orjson.loads(text[start : end + 1])
    except orjson.JSONDecodeError:
        return None


def parse_plan(text: str) -> Plan | None:
    """The plan written in `text` (`{"root_goal": ..., "subgoals": [...]}`), or None when it is not one."""
    data = _json_object(text)
    try:
        return Plan.model_validate(data) if isinstance(data, dict) else None
    except ValidationError:
        return None


def parse_tool_call(text: str) -> ToolChoice | None:
    """The tool call written in `text` (`{"tool": ..., "params": {...}}`), or None when it is not one."""
    data = _json_object(text)
    try:
        return ToolChoice.model_validate(data) if isinstance(data, dict) else None
    except ValidationError:
        return None


PLAN_INSTRUCTIONS = (
    "Break the user's request into sub-goals. Answer with one JSON object and nothing else:\n"
    '{"root_goal": "...", "subgoals": [{"id": "g1", "description": "...", "tool": "<tool name>", '
    '"depends_on": []}]}\n'
    "Use each tool at most once, only tools from this list, and no dependency cycles.\nTools:\n"
)

ACT_INSTRUCTIONS = (
    "Choose the next tool call. Answer with one JSON object and nothing else:\n"
    '{"tool": "<tool name>", "params": {...}, "subgoal_id": "<sub-goal id or null>"}\nTools:\n'
)


def plan_messages(user_query: str, tools: Mapping[str, SkillContract]) -> tuple[Message, ...]:
    """The planning prompt: the plan format, the tools the policy may use (with descriptions), the query."""
    listing = "\n".join(f"- {name}: {c.description}" for name, c in sorted(tools.items()))
    return (
        Message(role="system", content=PLAN_INSTRUCTIONS + listing),
        Message(role="user", content=user_query),
    )


def act_messages(session: Session, tools: Mapping[str, SkillContract]) -> tuple[Message, ...]:
    """The acting prompt: the tool-call format, the tools' OpenAI schemas, the query, the plan and the
    calls made so far (tool, status and output, one `tool` message each)."""
    schemas = "\n".join(orjson.dumps(c.to_openai_tool()).decode() for _, c in sorted(tools.items()))
    messages = [
        Message(role="system", content=ACT_INSTRUCTIONS + schemas),
        Message(role="user", content=session.user_query),
    ]
    if session.plan is not None:
        messages.append(Message(role="assistant", content=session.plan.model_dump_json()))
    for call in session.tool_calls:
        result = {
            "tool": call.tool,
            "subgoal_id": call.subgoal_id,
            "status": call.status,
            "output": call.output,
        }
        messages.append(Message(role="tool", content=orjson.dumps(result, default=str).decode()))
    return tuple(messages)
