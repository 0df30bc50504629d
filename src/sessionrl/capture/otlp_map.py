"""One span to sessionrl's records: LLM calls, tool calls, feedback and the session's own fields.

Pure functions of a `Span` (see `sessionrl.capture.otlp_spans`); no OpenTelemetry package is needed.
Three vocabularies are read, first match wins per field (docs/traces.md has the table):

- `sessionrl.*`, what `sessionrl sessions export --format otlp` writes for fields no standard has (token
  ids, logprobs, policy version, call ids, feedback with its delay, the plan), so a round trip is exact;
- OpenTelemetry's GenAI conventions: `gen_ai.operation.name` (chat, text_completion, generate_content,
  execute_tool), `gen_ai.input.messages` / `gen_ai.output.messages` / `gen_ai.system_instructions`
  (JSON, with typed parts), `gen_ai.usage.*`, `gen_ai.tool.*`, `gen_ai.evaluation.result` events;
- OpenInference's: `openinference.span.kind` (LLM, TOOL, ...), `llm.input_messages.N.message.*`,
  `llm.output_messages.N.message.*`, `llm.token_count.*`, `tool.*`, `input.value`, `output.value`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from sessionrl.capture.otlp_spans import STATUS_ERROR, Span, SpanEvent, from_ns, json_value
from sessionrl.session.model import (
    Anchor,
    CallStatus,
    Feedback,
    FeedbackType,
    FinalOutput,
    LLMCall,
    Message,
    Plan,
    ToolCall,
    ToolRequest,
)

Doc = dict[str, Any]
LLM, TOOL, OTHER = "llm", "tool", "other"
LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
EVALUATION_EVENT = "gen_ai.evaluation.result"
ROLES = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
ROLES |= {"model": "assistant", "human": "user", "ai": "assistant", "function": "tool"}


def role_of(span: Span) -> str:
    """Whether a span is an LLM call, a tool call, or structure (an agent, a chain, a workflow)."""
    operation = span.attributes.get("gen_ai.operation.name")
    kind = str(span.attributes.get("openinference.span.kind") or "").upper()
    if operation in LLM_OPERATIONS or kind == "LLM":
        return LLM
    if operation == "execute_tool" or kind == "TOOL":
        return TOOL
    return OTHER


def exported(span: Span) -> bool:
    """Whether sessionrl wrote the span: then its `sessionrl.*` attributes are the whole truth (one that
    is absent stands for None) and nothing is inferred from the standard ones."""
    return "sessionrl.call_id" in span.attributes or "sessionrl.session.state" in span.attributes


def call_id_of(span: Span) -> str:
    """The id a span's call gets: sessionrl's own, the tool call's id, or the span id."""
    if role_of(span) == TOOL:
        named = span.attr("sessionrl.call_id") or span.attr("gen_ai.tool.call.id") or span.attr("tool.id")
        return str(named or span.span_id)
    return str(span.attr("sessionrl.call_id") or span.span_id)


# LLM calls


def llm_call(span: Span) -> LLMCall:
    """An LLM span as a recorded LLM call."""
    a = span.attributes
    response, requested = _response(span)
    usage = _usage(span)
    return LLMCall(
        call_id=call_id_of(span),
        purpose=str(
            a["sessionrl.purpose"] if "sessionrl.purpose" in a else a.get("gen_ai.operation.name", "chat")
        ),
        messages=tuple(_input_messages(span)),
        response=response,
        prompt_token_ids=_ints(a.get("sessionrl.prompt_token_ids")),
        token_ids=_ints(a.get("sessionrl.token_ids")),
        logprobs=_floats(a.get("sessionrl.logprobs")),
        policy_version=_int_or_none(a.get("sessionrl.policy_version")),
        tokens_used=_tokens_used(a, usage),
        started_at=from_ns(span.start_ns),
        finished_at=from_ns(span.end_ns),
        model=_model(span),
        tool_calls=requested,
        usage=usage,
        latency_ms=_latency(span),
        status=_status(span),
        error_message=_error_message(span),
        recorded=bool(a.get("sessionrl.recorded", True)),
    )


def _status(span: Span) -> CallStatus:
    named = span.attributes.get("sessionrl.status")
    if named is not None:
        return CallStatus(named)
    return CallStatus.ERROR if span.status_code == STATUS_ERROR else CallStatus.SUCCESS


def _model(span: Span) -> str | None:
    a = span.attributes
    if exported(span):
        return _str_or_none(a.get("sessionrl.model"))
    name = a.get("gen_ai.response.model") or a.get("gen_ai.request.model") or a.get("llm.model_name")
    return str(name) if name else None


def _usage(span: Span) -> dict[str, int] | None:
    """Token counts as OpenAI names them; None when the span reports none."""
    a = span.attributes
    if "sessionrl.usage" in a:
        exact = json_value(a["sessionrl.usage"])
        return {str(k): int(v) for k, v in exact.items()} if isinstance(exact, dict) else None
    pairs = {
        "prompt_tokens": a.get("gen_ai.usage.input_tokens", a.get("llm.token_count.prompt")),
        "completion_tokens": a.get("gen_ai.usage.output_tokens", a.get("llm.token_count.completion")),
        "total_tokens": a.get("llm.token_count.total"),
    }
    found = {k: int(v) for k, v in pairs.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return found or None


def _tokens_used(a: dict[str, Any], usage: dict[str, int] | None) -> int | None:
    if "sessionrl.usage" in a:  # written by sessionrl: tokens_used is there exactly when it was known
        return _int_or_none(a.get("sessionrl.tokens_used"))
    if not usage:
        return None
    return usage.get("total_tokens", usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0))


def _input_messages(span: Span) -> list[Message]:
    a = span.attributes
    if "gen_ai.input.messages" in a:
        system = [_gen_ai_message({"role": "system", "parts": p}) for p in _system(a)]
        listed = json_value(a["gen_ai.input.messages"])
        return [m for ms in (system, *(_split_tool_parts(x) for x in _list(listed))) for m in ms]
    if any(k.startswith("llm.input_messages.") for k in a):
        return [_openinference_message(m) for m in _indexed(a, "llm.input_messages.")]
    request = json_value(a.get("input.value"))
    if isinstance(request, dict) and isinstance(request.get("messages"), list):
        return [openai_message(m) for m in request["messages"] if isinstance(m, dict)]
    if isinstance(request, list):
        return [openai_message(m) for m in request if isinstance(m, dict)]
    return [Message(role="user", content=request)] if isinstance(request, str) and request else []


def _system(a: dict[str, Any]) -> list[list[Any]]:
    parts = json_value(a.get("gen_ai.system_instructions"))
    return [parts] if isinstance(parts, list) and parts else []


def _response(span: Span) -> tuple[str, tuple[ToolRequest, ...]]:
    """The response text and the tool calls it asked for."""
    a = span.attributes
    if "gen_ai.output.messages" in a:
        first = next(iter(_list(json_value(a["gen_ai.output.messages"]))), None)
        message = _gen_ai_message(first) if isinstance(first, dict) else Message(role="assistant", content="")
        return message.content, message.tool_calls
    if any(k.startswith("llm.output_messages.") for k in a):
        outputs = _indexed(a, "llm.output_messages.")
        message = _openinference_message(outputs[0]) if outputs else Message(role="assistant", content="")
        return message.content, message.tool_calls
    output = json_value(a.get("output.value"))
    if isinstance(output, dict) and isinstance(output.get("choices"), list) and output["choices"]:
        output = output["choices"][0].get("message", {})
    if isinstance(output, dict):
        message = openai_message({"role": "assistant", **output})
        return message.content, message.tool_calls
    return (output if isinstance(output, str) else "" if output is None else _dumps(output)), ()


def _gen_ai_message(m: Doc) -> Message:
    """A GenAI-convention message: a role and typed parts (text, tool_call, tool_call_response)."""
    parts = [p for p in _list(m.get("parts")) if isinstance(p, dict)]
    text = "".join(str(p.get("content", "")) for p in parts if p.get("type") == "text")
    calls = tuple(
        _tool_request(p.get("id"), p.get("name"), p.get("arguments"), i)
        for i, p in enumerate(parts)
        if p.get("type") == "tool_call"
    )
    answer = next((p for p in parts if p.get("type") == "tool_call_response"), None)
    if answer is not None:
        return Message(
            role="tool", content=_as_text(answer.get("response")), tool_call_id=str(answer.get("id"))
        )
    return Message(role=ROLES.get(str(m.get("role")), "user"), content=text, tool_calls=calls)


def _split_tool_parts(m: Any) -> list[Message]:
    """A GenAI message, split in one `tool` message per tool_call_response part it holds."""
    if not isinstance(m, dict):
        return []
    answers = [
        p for p in _list(m.get("parts")) if isinstance(p, dict) and p.get("type") == "tool_call_response"
    ]
    if len(answers) <= 1:
        return [_gen_ai_message(m)]
    return [_gen_ai_message({"role": "tool", "parts": [p]}) for p in answers]


def _openinference_message(m: Doc) -> Message:
    """An OpenInference message, its `message.` prefix already taken off by `_indexed`."""
    calls = tuple(
        _tool_request(
            c.get("tool_call.id"), c.get("tool_call.function.name"), c.get("tool_call.function.arguments"), i
        )
        for i, c in enumerate(_indexed(m, "message.tool_calls."))
    )
    content = m.get("message.content")
    if content is None:
        content = "".join(str(c.get("message_content.text", "")) for c in _indexed(m, "message.contents."))
    answered = m.get("message.tool_call_id")
    return Message(
        role=ROLES.get(str(m.get("message.role")), "user"),
        content=_as_text(content),
        tool_calls=calls,
        tool_call_id=str(answered) if answered else None,
    )


def openai_message(m: Doc) -> Message:
    """A message in OpenAI's chat format (assistant `tool_calls`, `tool` messages by `tool_call_id`)."""
    calls = tuple(
        _tool_request(
            c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"), i
        )
        for i, c in enumerate(_list(m.get("tool_calls")))
        if isinstance(c, dict)
    )
    content = m.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    answered = m.get("tool_call_id")
    return Message(
        role=ROLES.get(str(m.get("role")), "user"),
        content=_as_text(content),
        tool_calls=calls,
        tool_call_id=str(answered) if answered else None,
    )


def _tool_request(call_id: Any, name: Any, arguments: Any, i: int) -> ToolRequest:
    """A requested tool call; arguments keep their text when they came as text."""
    text = arguments if isinstance(arguments, str) else "{}" if arguments is None else _dumps(arguments)
    return ToolRequest(id=str(call_id or f"call_{i}"), name=str(name or "unnamed"), arguments=text)


# tool calls


def tool_call(span: Span) -> ToolCall:
    """A tool span as a recorded tool call: arguments, result, status and error."""
    a = span.attributes
    return ToolCall(
        call_id=call_id_of(span),
        subgoal_id=_str_or_none(a.get("sessionrl.subgoal_id")),
        tool=str(a.get("gen_ai.tool.name") or a.get("tool.name") or span.name.removeprefix("execute_tool ")),
        params=_params(a.get("gen_ai.tool.call.arguments", a.get("input.value"))),
        output=json_value(a.get("gen_ai.tool.call.result", a.get("output.value"))),
        status=_status(span),
        error_code=_str_or_none(a.get("sessionrl.error_code" if exported(span) else "error.type")),
        error_message=_error_message(span),
        retryable=bool(a.get("sessionrl.retryable", False)),
        latency_ms=_latency(span),
        attempt=int(a.get("sessionrl.attempt", 1)),
        warnings=tuple(str(w) for w in _list(a.get("sessionrl.warnings"))),
        started_at=from_ns(span.start_ns),
        finished_at=from_ns(span.end_ns),
        recorded=bool(a.get("sessionrl.recorded", True)),
        free_form=bool(a.get("sessionrl.free_form", True)),
    )


def _params(value: Any) -> Doc:
    decoded = json_value(value)
    if decoded is None:
        return {}
    return decoded if isinstance(decoded, dict) else {"arguments": decoded}


# feedback


def feedback(span: Span, anchor_call: str | None) -> list[Feedback]:
    """The span's evaluation results as feedback, anchored to `anchor_call` unless one names its anchor:
    GenAI's `gen_ai.evaluation.result` events, and the span itself when it carries `gen_ai.evaluation.*`
    attributes (an evaluation span, at its end)."""
    found = [e for e in span.events if e.name == EVALUATION_EVENT]
    if "gen_ai.evaluation.name" in span.attributes:
        found.append(SpanEvent(EVALUATION_EVENT, span.end_ns, span.attributes))
    return [_feedback(span, i, e, anchor_call) for i, e in enumerate(found)]


def _feedback(span: Span, i: int, event: SpanEvent, anchor_call: str | None) -> Feedback:
    a = event.attributes
    ours = "sessionrl.feedback.id" in a
    score = a.get("gen_ai.evaluation.score.value")
    label = a.get("gen_ai.evaluation.score.label")
    data = json_value(a.get("sessionrl.feedback.data"))
    if not isinstance(data, dict):
        data = {"label": label} if label is not None else {}
    kind = a.get("sessionrl.feedback.type") or (
        FeedbackType.AUTO_VALIDATION if score is not None else FeedbackType.COMMENT
    )
    anchor = json_value(a.get("sessionrl.feedback.anchor"))
    at = from_ns(event.time_ns)
    return Feedback(
        feedback_id=str(a.get("sessionrl.feedback.id") or f"{span.span_id}.e{i}"),
        type=FeedbackType(kind),
        score=float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None,
        comment=_str_or_none(a.get("gen_ai.evaluation.explanation")),
        annotator=_str_or_none(a.get("sessionrl.feedback.annotator" if ours else "gen_ai.evaluation.name")),
        anchor=Anchor.model_validate(anchor) if isinstance(anchor, dict) else Anchor(call_id=anchor_call),
        occurred_at=_time(a.get("sessionrl.feedback.occurred_at")) or at,
        received_at=_time(a.get("sessionrl.feedback.received_at")) or at,
        data=data,
    )


# the session's own fields, read from its root span


def plan(root: Span) -> Plan | None:
    """The plan sessionrl exported on the root span, if any."""
    value = json_value(root.attributes.get("sessionrl.plan"))
    return Plan.model_validate(value) if isinstance(value, dict) else None


def final_output(root: Span) -> FinalOutput | None:
    """The root span's output: sessionrl's own (with provenance), else its output messages or value."""
    if "sessionrl.final_output" in root.attributes:
        exact = json_value(root.attributes["sessionrl.final_output"])
        return FinalOutput.model_validate(exact) if isinstance(exact, dict) else None
    if role_of(root) != OTHER:
        return None
    text = _response(root)[0]
    return FinalOutput(text=text) if text else None


def user_query(span: Span) -> str | None:
    """The request a span answers: sessionrl's own, else the last user message of its input."""
    named = span.attr("sessionrl.session.user_query")
    if named is not None:
        return str(named)
    users = [m.content for m in _input_messages(span) if m.role == "user" and m.content]
    return users[-1] if role_of(span) == OTHER and users else (users[0] if users else None)


def session_fields(root: Span | None) -> Doc:
    """The session's descriptive fields sessionrl exported on its spans' resource (or OpenInference's
    `user.id`)."""
    if root is None:
        return {}
    fields = {
        "scenario": root.attr("sessionrl.session.scenario"),
        "tags": tuple(str(t) for t in _list(root.attr("sessionrl.session.tags"))) or None,
        "user_id": root.attr("sessionrl.session.user_id" if root.attr("sessionrl.session.id") else "user.id"),
        "metadata": json_value(root.attr("sessionrl.session.metadata")),
    }
    return {k: v for k, v in fields.items() if v is not None}


# small readers


def _indexed(attrs: dict[str, Any], prefix: str) -> list[Doc]:
    """Flattened `prefix.N.rest` keys as a list of `{rest: value}` dicts, by N."""
    found: dict[int, Doc] = {}
    for key, value in attrs.items():
        if key.startswith(prefix):
            index, _, rest = key[len(prefix) :].partition(".")
            if index.isdigit() and rest:
                found.setdefault(int(index), {})[rest] = value
    return [found[i] for i in sorted(found)]


def _latency(span: Span) -> float:
    exact = span.attributes.get("sessionrl.latency_ms")
    return float(exact) if exact is not None else max(0.0, (span.end_ns - span.start_ns) / 1e6)


def _error_message(span: Span) -> str | None:
    if exported(span):
        return _str_or_none(span.attributes.get("sessionrl.error_message"))
    if span.status_code != STATUS_ERROR:
        return None
    thrown = next((e for e in span.events if e.name == "exception"), None)
    said = thrown.attributes.get("exception.message") if thrown else None
    return span.status_message or _str_or_none(said) or _str_or_none(span.attributes.get("error.type"))


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _ints(value: Any) -> tuple[int, ...] | None:
    return tuple(int(v) for v in value) if isinstance(value, list) else None


def _floats(value: Any) -> tuple[float, ...] | None:
    return tuple(float(v) for v in value) if isinstance(value, list) else None


def _int_or_none(value: Any) -> int | None:
    return int(value) if value is not None else None


def _str_or_none(value: Any) -> str | None:
    return str(value) if value is not None else None


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else _dumps(value)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()
