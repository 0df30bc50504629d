"""Value references: an action may point at a value already in the conversation instead of retyping it.

Inside a tool call's parameters or a final message the policy may write

* ``{{express_contact.waybill}}`` — field ``waybill`` of the latest successful result of the tool
  ``express_contact`` (a dotted path goes deeper, list positions included: ``{{lookup.items.0.sku}}``;
  a result may be any JSON value, so ``{{find_user.0}}`` is the first item of a list and ``{{find_user}}``
  a whole result, such as the string a τ-bench tool answers with);
* ``{{user.phone}}`` — the identifier (a word holding a digit) that follows the word ``phone`` in the
  user's request.

This is the evidence-variable idea of plan-and-execute agents: the executor substitutes the values, so
ids, codes and timestamps reach the tools exactly as they were read. Naming the tool rather than a
position keeps a reference valid when a failed call is tried again. A parameter that is one reference
and nothing else takes the referenced value with its JSON type (a timestamp stays an integer); inside
longer text a reference becomes the value's text. An unknown reference is left as written, and the
tool's validation (or the reader) sees it. Literal values are always accepted too.

`abstract` goes the other way: it rewrites literal values of an expert's action as references where the
conversation already holds them, which is how demonstrations teach the habit.

>>> ctx = Context.of("Lost? order O-123456 · phone 13800001234", [("track", {"waybill": "SF1", "n": 7})])
>>> resolve({"order": "{{user.order}}", "n": "{{track.n}}", "note": "ship {{track.waybill}}"}, ctx)
{'order': 'O-123456', 'n': 7, 'note': 'ship SF1'}
>>> abstract({"phone": "13800001234", "waybill": "SF1"}, ctx)
{'phone': '{{user.phone}}', 'waybill': '{{track.waybill}}'}
>>> said = Context.of("", [("find_user", "sara_1234"), ("orders", ["#W1", "#W2"])])
>>> resolve({"user_id": "{{find_user}}", "first": "{{orders.0}}"}, said)
{'user_id': 'sara_1234', 'first': '#W1'}
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from sessionrl.session.model import Message

REFERENCE = re.compile(r"\{\{\s*([\w.-]+)\s*\}\}")
"""A reference: names as `Context.names` writes them (a request's label may be any word, 改寄到 too)."""
IDENTIFIER = r"(?=[\w-]*\d)[\w-]+"
LABELLED = re.compile(rf"([^\W\d_]+)[\s:#]+({IDENTIFIER})")
"""A label word, then (after spaces, a colon or a hash) an identifier holding a digit."""
MIN_TEXT_LENGTH = 2
"""Shortest literal `abstract` replaces inside free text (shorter strings would match by accident)."""


@dataclass(frozen=True, slots=True)
class Context:
    """What references can point at: the user's request and the successful tool results so far."""

    request: str
    results: tuple[tuple[str, Any], ...]
    """`(tool, output)` of each successful call, in call order."""

    @classmethod
    def of(cls, request: str, results: Sequence[tuple[str, Any]]) -> Context:
        """A context from the request text and the `(tool, output)` of successful calls in order."""
        return cls(request, tuple(results))

    @classmethod
    def from_messages(cls, messages: Sequence[Message]) -> Context:
        """The context of a conversation: its first user message, and each successful tool message (as
        `sessionrl.policy.llm.tool_message` writes them; failed, unnamed or cut ones are skipped)."""
        request = next((m.content for m in messages if m.role == "user"), "")
        results = (_tool_result(m.content) for m in messages if m.role == "tool")
        return cls(request, tuple(r for r in results if r is not None))

    def lookup(self, name: str) -> tuple[bool, Any]:
        """`(found, value)` of one reference name such as ``user.phone`` or ``lookup.items.0.sku``."""
        head, _, rest = name.partition(".")
        if head == "user":
            return self._labelled(rest)
        latest = [output for tool, output in self.results if tool == head]
        if not latest:
            return False, None
        return _walk(latest[-1], rest.split(".") if rest else [])

    def _labelled(self, label: str) -> tuple[bool, Any]:
        for word, value in LABELLED.findall(self.request):
            if word.casefold() == label.casefold():
                return True, value
        return False, None

    def names(self) -> Iterator[tuple[str, Any]]:
        """Every reference this context resolves, with its value: labelled request ids (the last label of
        a kind first), then the fields of each tool's latest result, tools in order of first use."""
        seen: set[str] = set()
        for word, value in reversed(LABELLED.findall(self.request)):  # a request's form fields come last
            if word.casefold() not in seen:
                seen.add(word.casefold())
                yield f"user.{word}", value
        latest = dict(self.results)
        for tool in dict.fromkeys(tool for tool, _ in self.results):
            yield from _leaves(tool, latest[tool])


def resolve(value: Any, context: Context) -> Any:
    """`value` (a JSON value: text, list, mapping, ...) with every known reference substituted."""
    if isinstance(value, dict):
        return {k: resolve(v, context) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, context) for v in value]
    if not isinstance(value, str):
        return value
    whole = REFERENCE.fullmatch(value.strip())
    if whole is not None:
        found, target = context.lookup(whole.group(1))
        return target if found else value
    return REFERENCE.sub(lambda m: _text(context, m), value)


def _text(context: Context, match: re.Match[str]) -> str:
    found, target = context.lookup(match.group(1))
    if not found:
        return match.group(0)
    return target if isinstance(target, str) else orjson.dumps(target).decode()


def abstract(value: Any, context: Context) -> Any:
    """`value` with literals the context holds rewritten as references (the first name found wins)."""
    names = [(name, v) for name, v in context.names() if _referable(v)]
    return _abstract(value, names)


def _abstract(value: Any, names: list[tuple[str, Any]]) -> Any:
    if isinstance(value, dict):
        return {k: _abstract(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_abstract(v, names) for v in value]
    exact = next((name for name, v in names if v == value and type(v) is type(value)), None)
    if exact is not None:
        return f"{{{{{exact}}}}}"
    if isinstance(value, str):
        return abstract_text(value, names)
    return value


def abstract_text(text: str, names: list[tuple[str, Any]]) -> str:
    """Free text with every embedded id-like literal (holding a digit, at least two characters long)
    replaced by a reference."""
    for name, v in names:
        literal = str(v)
        if len(literal) >= MIN_TEXT_LENGTH and any(c.isdigit() for c in literal):
            text = re.sub(rf"(?<![\w-]){re.escape(literal)}(?![\w-])", f"{{{{{name}}}}}", text)
    return text


def _referable(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool) and str(value) != ""


def _tool_result(content: str) -> tuple[str, Any] | None:
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    if not (isinstance(body, dict) and body.get("ok") and isinstance(body.get("tool"), str)):
        return None
    return body["tool"], body.get("output")


def _walk(value: Any, path: list[str]) -> tuple[bool, Any]:
    for step in path:
        if isinstance(value, dict) and step in value:
            value = value[step]
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            return False, None
    return True, value


def _leaves(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(f"{prefix}.{key}", item)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(f"{prefix}.{i}", item)
    elif value is not None:
        yield prefix, value


__all__ = ["Context", "abstract", "abstract_text", "resolve"]
