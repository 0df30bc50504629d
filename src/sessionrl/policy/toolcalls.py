"""How the LLM policy writes tool calls, and how its replies are read back into OpenAI-style tool calls.

Three formats (`ToolFormat`), chosen from the tokenizer's chat template (`format_for`):

- ``action``: the compact action language of the tiny model (`sessionrl.policy.llm.tool_action`),
  ``{"tool":"NAME","params":{...}}`` or ``{"final":"..."}``; anything else is not an action.
- ``tagged``: for chat templates without tool support (SmolLM2's ChatML). The system prompt teaches one
  format: a call is ``<tool_call>{"name": "NAME", "arguments": {...}}</tool_call>``, and plain text is the
  answer to the user.
- ``native``: the chat template renders the tools itself (``apply_chat_template(messages, tools=...)``)
  and the model answers in its own syntax, read by `native_calls`: Hermes/Qwen ``<tool_call>`` JSON,
  Llama-3 JSON (``{"name": ..., "parameters": {...}}``, after ``<|python_tag|>`` or alone) and Mistral's
  ``[TOOL_CALLS][...]``.

Whatever the format, a reply is read into one `ParsedReply`: the text to the user and the tool calls as
`ToolRequest`s, the structure the orchestrator's episodes run and the gateway answers with.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import orjson

from sessionrl.orchestrator.policy import parse_tool_call
from sessionrl.session.model import ToolRequest

TAGGED_INSTRUCTIONS: Final = (
    "To call a tool, answer with one line and nothing else:\n"
    '<tool_call>{"name": "<tool name>", "arguments": {<argument>: <value>, ...}}</tool_call>\n'
    "The tool's result comes back in the next message. To answer the user, write the answer as plain text "
    "without a tool call; that ends the conversation."
)

TOOLS_HEADING: Final = "Tools:"
"""The line that starts the system prompt's list of tools (`tool_listing`)."""

_TAGGED: Final = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_MISTRAL: Final = "[TOOL_CALLS]"
_PYTHON_TAG: Final = "<|python_tag|>"


class ToolFormat(StrEnum):
    """How tool calls are written (see the module doc)."""

    ACTION = "action"
    TAGGED = "tagged"
    NATIVE = "native"


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """A policy reply read as an answer: its text to the user and the tool calls it asks for.

    `valid` is False when the reply is no answer at all: not an action in the action language, a tool
    call whose JSON does not parse, or nothing but whitespace.
    """

    text: str
    tool_calls: tuple[ToolRequest, ...] = ()
    valid: bool = True

    @property
    def is_final(self) -> bool:
        """A valid reply that calls no tool: the answer that ends the episode."""
        return self.valid and not self.tool_calls


def format_for(tokenizer: Any) -> ToolFormat:
    """The format a tokenizer's chat template calls for: the tiny model's own template speaks the action
    language, a template that reads ``tools`` renders them natively, any other is taught `TAGGED`."""
    from sessionrl.policy.tiny import CHAT_TEMPLATE

    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or template == CHAT_TEMPLATE:
        return ToolFormat.ACTION
    return ToolFormat.NATIVE if re.search(r"\btools\b", template) else ToolFormat.TAGGED


def tool_listing(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system prompt's list of `tools` (OpenAI tool schemas): a heading, then one schema per line as
    compact JSON.

    >>> print(tool_listing([{"type": "function", "function": {"name": "f"}}]))
    Tools:
    {"type":"function","function":{"name":"f"}}
    """
    return TOOLS_HEADING + "\n" + "\n".join(orjson.dumps(tool).decode() for tool in tools)


def listed_tools(system: str) -> tuple[str, list[dict[str, Any]]]:
    """A system prompt split into its text before the `tool_listing` that ends it and the tools listed
    there; ``(system, [])`` when it ends with no such listing.

    A native chat template renders tools itself (``apply_chat_template(..., tools=...)``), so the policy
    takes them out of the system message it is given; the message keeps them, so a recorded conversation
    renders the same prompt again when it is trained on.

    >>> listed_tools('Be kind.\\n\\nTools:\\n{"type":"function","function":{"name":"f"}}')
    ('Be kind.', [{'type': 'function', 'function': {'name': 'f'}}])
    >>> listed_tools('Tools:\\n{"type":"function","function":{"name":"f"}}')
    ('', [{'type': 'function', 'function': {'name': 'f'}}])
    >>> listed_tools("Be kind.\\nTools:\\nsms_send(phone)")
    ('Be kind.\\nTools:\\nsms_send(phone)', [])
    """
    head, found, listing = f"\n{system}".rpartition(f"\n{TOOLS_HEADING}\n")
    tools = [_json(line) for line in listing.splitlines()] if found else []
    if not tools or not all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools):
        return system, []
    return head.removeprefix("\n").rstrip(), tools


def write_call(fmt: ToolFormat, name: str, arguments: Mapping[str, Any]) -> str:
    """The assistant text that calls `name` with `arguments` in format `fmt`.

    >>> write_call(ToolFormat.TAGGED, "refund", {"order": "A1"})
    '<tool_call>{"name":"refund","arguments":{"order":"A1"}}</tool_call>'
    """
    if fmt is ToolFormat.ACTION:
        return orjson.dumps({"tool": name, "params": dict(arguments)}).decode()
    body = orjson.dumps({"name": name, "arguments": dict(arguments)}).decode()
    return f"<tool_call>{body}</tool_call>"


def write_final(fmt: ToolFormat, text: str) -> str:
    """The assistant text that answers the user with `text` in format `fmt`.

    >>> write_final(ToolFormat.ACTION, "Done."), write_final(ToolFormat.TAGGED, "Done.")
    ('{"final":"Done."}', 'Done.')
    """
    return orjson.dumps({"final": text}).decode() if fmt is ToolFormat.ACTION else text


def call_id(seed: str, index: int, name: str) -> str:
    """A deterministic id for the `index`-th tool call of a reply (OpenAI's ``call_...`` shape)."""
    return "call_" + hashlib.blake2b(f"{seed}:{index}:{name}".encode(), digest_size=8).hexdigest()


def parse_reply(fmt: ToolFormat, text: str, *, seed: str = "") -> ParsedReply:
    """`text`, a policy reply in format `fmt`, as a `ParsedReply`; call ids derive from `seed`.

    >>> reply = parse_reply(ToolFormat.TAGGED, 'Looking. <tool_call>{"name": "f", "arguments": {"a": 1}}')
    >>> reply.text, [(c.name, c.arguments) for c in reply.tool_calls], reply.is_final
    ('Looking.', [('f', '{"a":1}')], False)
    >>> parse_reply(ToolFormat.ACTION, '{"final": "Refunded."}').text
    'Refunded.'
    """
    if fmt is ToolFormat.ACTION:
        return _parse_action(text, seed)
    found = native_calls(text)
    if found is None:
        stripped = text.strip()
        return ParsedReply(stripped, (), bool(stripped))
    head, calls = found
    if calls is None:
        return ParsedReply(text.strip(), (), False)
    requests = tuple(
        ToolRequest(id=call_id(seed, i, name), name=name, arguments=orjson.dumps(args).decode())
        for i, (name, args) in enumerate(calls)
    )
    return ParsedReply(head, requests)


def _parse_action(text: str, seed: str) -> ParsedReply:
    start, end = text.find("{"), text.rfind("}")
    data: Any = None
    if 0 <= start < end:
        try:
            data = orjson.loads(text[start : end + 1])
        except orjson.JSONDecodeError:
            data = None
    if isinstance(data, dict) and set(data) == {"final"} and isinstance(data["final"], str):
        return ParsedReply(data["final"])
    choice = parse_tool_call(text)
    if choice is None:
        return ParsedReply(text, (), False)
    arguments = orjson.dumps(choice.params).decode()
    return ParsedReply(
        "", (ToolRequest(id=call_id(seed, 0, choice.tool), name=choice.tool, arguments=arguments),)
    )


Call = tuple[str, dict[str, Any]]


def native_calls(text: str) -> tuple[str, list[Call] | None] | None:
    """The tool calls `text` writes in a native syntax: None when it writes none, else the text before
    them and the calls (``(name, arguments)``), or None for the calls when the syntax is there but broken.

    >>> native_calls('<|python_tag|>{"name": "f", "parameters": {"x": 2}}')
    ('', [('f', {'x': 2})])
    >>> native_calls('[TOOL_CALLS][{"name": "g", "arguments": {}}]')
    ('', [('g', {})])
    >>> native_calls("<tool_call>{oops</tool_call>")
    ('', None)
    >>> native_calls("Your order ships today.") is None
    True
    """
    if "<tool_call>" in text:
        head = text[: text.index("<tool_call>")].strip()
        bodies = [_json(body) for body in _TAGGED.findall(text)]
        return head, _calls(bodies)
    if _MISTRAL in text:
        head, _, rest = text.partition(_MISTRAL)
        listed = _json(rest)
        return head.strip(), _calls(listed if isinstance(listed, list) else [listed])
    head, tagged, rest = text.partition(_PYTHON_TAG)
    body = rest if tagged else text
    stripped = body.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        parts = [_json(part) for part in stripped.split(";")] if tagged else [_json(stripped)]
        calls = _calls(parts)
        if calls is not None or tagged:
            return head.strip() if tagged else "", calls
    return None


def _json(text: str) -> Any:
    try:
        return orjson.loads(text.strip())
    except orjson.JSONDecodeError:
        return None


def _calls(bodies: Sequence[Any]) -> list[Call] | None:
    """Each body as ``(name, arguments)``, or None when any is not a call (a name and an object of
    arguments, under ``arguments`` or ``parameters``, which may also be JSON text)."""
    calls: list[Call] = []
    for body in bodies:
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not body["name"]:
            return None
        arguments = body.get("arguments", body.get("parameters", {}))
        if isinstance(arguments, str):
            arguments = _json(arguments)
        if not isinstance(arguments, dict):
            return None
        calls.append((body["name"], arguments))
    return calls or None


def tool_format_of(backend: object) -> ToolFormat:
    """The format a policy backend writes: its `tool_format` (`HFPolicy` has one), else the action
    language, which scripted backends and older policies speak."""
    fmt = getattr(backend, "tool_format", ToolFormat.ACTION)
    return fmt if isinstance(fmt, ToolFormat) else ToolFormat.ACTION


__all__ = [
    "TAGGED_INSTRUCTIONS",
    "TOOLS_HEADING",
    "ParsedReply",
    "ToolFormat",
    "call_id",
    "format_for",
    "listed_tools",
    "native_calls",
    "parse_reply",
    "tool_format_of",
    "tool_listing",
    "write_call",
    "write_final",
]
