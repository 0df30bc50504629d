"""What answers a chat request behind the gateway: the service's own policy, an upstream server, a script.

A `ChatBackend` answers one request for one session with a `ChatReply` (text or tool calls, the model's
name, usage, and for our own policy the prompt and completion token ids with their log-probabilities),
or raises `UpstreamError` carrying the status and message the agent should see.

- `PolicyChat` serves requests with the service's policy backends (a Hugging Face causal LM or the tiny
  model): the policy writes tool calls in its format (`sessionrl.policy.toolcalls`: the tiny model's
  action language, `{"tool": ..., "params": {...}}` or `{"final": ...}`, or `<tool_call>` JSON and the
  model's native syntax), read into tool calls or the answer's text, as the orchestrator's episodes read
  them. The tokens it sampled are recorded as they are.
- `UpstreamChat` (`sessionrl.gateway.upstream`) proxies to an OpenAI-compatible server and reports what
  its answer says.
- `ScriptedChat` answers from a function of the request, for tests and demos; it emits real tool calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from sessionrl.gateway.chat import ChatRequest
from sessionrl.orchestrator.lanes import route
from sessionrl.orchestrator.policy import PolicyBackend, PolicyError
from sessionrl.policy.references import Context, resolve
from sessionrl.policy.toolcalls import (
    ToolFormat,
    parse_reply,
    tool_format_of,
    tool_listing,
    write_call,
)
from sessionrl.session.model import Message, ToolRequest

SAMPLED, UPSTREAM, RETOKENISED = "sampled", "upstream", "retokenised"
"""Where a session's token ids come from (its `token_source` metadata): the service's own policy as it
sampled them, an upstream asked for them (vLLM's OpenAI server), or nowhere (training re-tokenises the
text; an upstream that was asked but gave none for a call leaves that call so too)."""


class UpstreamError(Exception):
    """The backend could not answer; `status` and `message` are what the agent is told."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ChatReply:
    """One model answer: text or tool calls, and what is known of how it was made."""

    text: str = ""
    tool_calls: tuple[ToolRequest, ...] = ()
    model: str = ""
    usage: dict[str, int] = field(default_factory=dict)
    prompt_token_ids: tuple[int, ...] | None = None
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    policy_version: int | None = None
    """The version of our policy that sampled the tokens (None for other backends)."""


class ChatBackend(Protocol):
    """Answers chat requests."""

    async def complete(self, request: ChatRequest, session_id: str) -> ChatReply:
        """The answer to `request`, made for `session_id`; `UpstreamError` when there is none."""
        ...

    async def models(self) -> list[str]:
        """The model names this backend serves."""
        ...


class ScriptedChat:
    """Answers with `script(request)`. `ScriptedChat.turns(replies)` answers a conversation's k-th
    assistant turn with `replies[k]`, so a retried request gets the same answer."""

    token_source = RETOKENISED

    def __init__(self, script: Callable[[ChatRequest], ChatReply], *, model: str = "scripted") -> None:
        self._script = script
        self.model = model

    @classmethod
    def turns(cls, replies: Sequence[ChatReply], *, model: str = "scripted") -> ScriptedChat:
        """A script answering the k-th assistant turn of any conversation with `replies[k]`."""

        def script(request: ChatRequest) -> ChatReply:
            turn = sum(m.role == "assistant" for m in request.messages)
            if turn >= len(replies):
                raise UpstreamError(500, f"the script has no reply for turn {turn}")
            return replies[turn]

        return cls(script, model=model)

    async def complete(self, request: ChatRequest, session_id: str) -> ChatReply:
        reply = self._script(request)
        return reply if reply.model else ChatReply(**{**reply.__dict__, "model": self.model})

    async def models(self) -> list[str]:
        return [self.model]


class PolicyChat:
    """The service's own policy behind the gateway; each session always meets the same backend."""

    token_source = SAMPLED

    def __init__(self, backends: Sequence[PolicyBackend], *, model: str = "sessionrl-policy") -> None:
        if not backends:
            raise ValueError("PolicyChat needs at least one policy backend")
        self._backends = tuple(backends)
        self.model = model

    async def complete(self, request: ChatRequest, session_id: str) -> ChatReply:
        backend = self._backends[route(session_id, len(self._backends))]
        fmt = tool_format_of(backend)
        messages = offered_tools([policy_view(m.to_message(), fmt) for m in request.messages], request, fmt)
        try:
            reply = await backend.generate(messages, purpose="chat")
        except PolicyError as exc:
            raise UpstreamError(503, str(exc)) from exc
        text, calls = read_action(reply.text, request, seed=f"{session_id}:{len(messages)}", fmt=fmt)
        prompt, completion = len(reply.prompt_token_ids or ()), len(reply.token_ids or ())
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        return ChatReply(
            text=text,
            tool_calls=calls,
            model=self.model,
            usage=usage,
            prompt_token_ids=reply.prompt_token_ids,
            token_ids=reply.token_ids,
            logprobs=reply.logprobs,
            policy_version=reply.policy_version,
        )

    async def models(self) -> list[str]:
        return [self.model]


def offered_tools(messages: list[Message], request: ChatRequest, fmt: ToolFormat) -> list[Message]:
    """`messages` as a policy in format `fmt` must read them to know the request's tools.

    A native chat template renders tools itself, and `HFPolicy.render` takes them from the
    `toolcalls.tool_listing` that ends the system message, as episodes write it; so for the native format
    the request's tools are listed there (in a system message of their own when the agent sent none).
    The action language and the tagged format read the agent's messages as they are: its own prompt
    says what it offers.
    """
    if fmt is not ToolFormat.NATIVE or not request.tools:
        return messages
    listing = tool_listing(request.tool_dicts())
    if messages and messages[0].role == "system":
        first = messages[0]
        return [first.model_copy(update={"content": f"{first.content}\n\n{listing}"}), *messages[1:]]
    return [Message(role="system", content=listing), *messages]


def policy_view(message: Message, fmt: ToolFormat = ToolFormat.ACTION) -> Message:
    """A message as the policy reads it: an assistant's tool call written in its tool-call format `fmt`."""
    if message.role != "assistant" or not message.tool_calls or message.content:
        return message
    call = message.tool_calls[0]
    try:
        params = orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        params = {}
    arguments = params if isinstance(params, dict) else {}
    return Message(role="assistant", content=write_call(fmt, call.name, arguments))


def read_action(
    text: str, request: ChatRequest, *, seed: str, fmt: ToolFormat = ToolFormat.ACTION
) -> tuple[str, tuple[ToolRequest, ...]]:
    """The policy's text (tool calls in format `fmt`, read by `toolcalls.parse_reply`) as an answer: its
    tool calls when each names a tool the request offers, the message of a final answer, or the text as
    it is. Value references the policy wrote (`sessionrl.policy.references`: ``{{user.order}}``,
    ``{{inventory_check.on_hand}}``) are resolved against the request's conversation
    (`conversation_context`), as an episode resolves them, so the agent receives the values.

    >>> tool = {"type": "function", "function": {"name": "f"}}
    >>> req = ChatRequest(messages=[{"role": "user", "content": "hi"}], tools=[tool])
    >>> read_action('{"tool": "f", "params": {"a": 1}}', req, seed="s")[1][0].arguments
    '{"a":1}'
    >>> read_action('{"final": "done"}', req, seed="s")
    ('done', ())
    """
    reply = parse_reply(fmt, text, seed=f"{seed}:{text}")
    offered = request.tool_names()
    context = conversation_context([m.to_message() for m in request.messages])
    if request.allows_tools() and reply.tool_calls and all(c.name in offered for c in reply.tool_calls):
        return reply.text, tuple(_resolved(c, context) for c in reply.tool_calls)
    return (str(resolve(reply.text, context)) if reply.is_final else text), ()


def conversation_context(messages: Sequence[Message]) -> Context:
    """What references in a reply to `messages` can point at: the first user message, and each tool
    result the agent sent back (its JSON, under the name of the call it answers by `tool_call_id`)."""
    names = {c.id: c.name for m in messages if m.role == "assistant" for c in m.tool_calls}
    results = []
    for message in messages:
        if message.role != "tool" or message.tool_call_id not in names:
            continue
        try:
            output = orjson.loads(message.content)
        except orjson.JSONDecodeError:
            output = message.content
        results.append((names[message.tool_call_id], output))
    request = next((m.content for m in messages if m.role == "user"), "")
    return Context.of(request, results)


def _resolved(call: ToolRequest, context: Context) -> ToolRequest:
    """`call` with the references in its arguments resolved (arguments that are not JSON stay as they are)."""
    try:
        arguments = orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        return call
    resolved = orjson.dumps(resolve(arguments, context)).decode()
    return call if resolved == call.arguments else call.model_copy(update={"arguments": resolved})
