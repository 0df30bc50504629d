"""Spans for the trace tests: one small agent run (a question, a tool call, an answer) written in the
GenAI conventions and in OpenInference's, as their instrumentations write it."""

from __future__ import annotations

from typing import Any

import orjson

from sessionrl.capture.otlp_spans import STATUS_ERROR, STATUS_UNSET, Span, SpanEvent

TRACE = "0af7651916cd43dd8448eb211c80319c"
T0 = 1_780_000_000_000_000_000
MS = 1_000_000
QUESTION = "Where is order 7?"
ANSWER = "Order 7 ships tomorrow."
ARGS = {"order_id": 7}
RESULT = {"status": "packed"}


def span(
    span_id: str,
    parent: str | None,
    name: str,
    attributes: dict[str, Any],
    start_ms: int,
    end_ms: int,
    *,
    trace: str = TRACE,
    events: tuple[SpanEvent, ...] = (),
    status: int = STATUS_UNSET,
    message: str = "",
) -> Span:
    return Span(
        trace,
        span_id,
        parent,
        name,
        T0 + start_ms * MS,
        T0 + end_ms * MS,
        attributes,
        events,
        status,
        message,
    )


def _j(value: Any) -> str:
    return orjson.dumps(value).decode()


def genai_trace(trace: str = TRACE, *, tool_fails: bool = False) -> list[Span]:
    """root (invoke_agent) > chat (asks for the tool) > execute_tool > chat (answers, rated 0.9)."""
    user = [{"role": "user", "parts": [{"type": "text", "content": QUESTION}]}]
    asked = {
        "role": "assistant",
        "parts": [{"type": "tool_call", "id": "call_1", "name": "order_status", "arguments": ARGS}],
    }
    answered = {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "call_1", "response": _j(RESULT)}],
    }
    rated = SpanEvent(
        "gen_ai.evaluation.result",
        T0 + 90 * MS,
        {
            "gen_ai.evaluation.name": "helpfulness",
            "gen_ai.evaluation.score.value": 0.9,
            "gen_ai.evaluation.explanation": "answers the question",
        },
    )
    chat = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "fake-1",
        "gen_ai.provider.name": "openai",
    }
    tool = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "order_status",
        "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.call.arguments": _j(ARGS),
    }
    if tool_fails:
        tool["error.type"] = "TimeoutError"
    else:
        tool["gen_ai.tool.call.result"] = _j(RESULT)
    return [
        span(
            "a000000000000001",
            None,
            "invoke_agent shop",
            {"gen_ai.operation.name": "invoke_agent"},
            0,
            100,
            trace=trace,
        ),
        span(
            "a000000000000002",
            "a000000000000001",
            "chat fake-1",
            {
                **chat,
                "gen_ai.input.messages": _j(user),
                "gen_ai.output.messages": _j([asked]),
                "gen_ai.usage.input_tokens": 11,
                "gen_ai.usage.output_tokens": 5,
            },
            1,
            20,
            trace=trace,
        ),
        span(
            "a000000000000003",
            "a000000000000001",
            "execute_tool order_status",
            tool,
            21,
            30,
            trace=trace,
            status=STATUS_ERROR if tool_fails else STATUS_UNSET,
            message="timed out" if tool_fails else "",
        ),
        span(
            "a000000000000004",
            "a000000000000001",
            "chat fake-1",
            {
                **chat,
                "gen_ai.input.messages": _j([*user, asked, answered]),
                "gen_ai.output.messages": _j(
                    [{"role": "assistant", "parts": [{"type": "text", "content": ANSWER}]}]
                ),
                "gen_ai.usage.input_tokens": 20,
                "gen_ai.usage.output_tokens": 6,
            },
            31,
            80,
            trace=trace,
            events=(rated,),
        ),
    ]


def openinference_trace(trace: str = TRACE) -> list[Span]:
    """The same run as `genai_trace`, as OpenInference's instrumentation and tracer write it."""

    def msg(i: int, role: str, **fields: Any) -> dict[str, Any]:
        out = {f"llm.input_messages.{i}.message.role": role}
        return out | {f"llm.input_messages.{i}.message.{k}": v for k, v in fields.items()}

    call = {
        "message.tool_calls.0.tool_call.id": "call_1",
        "message.tool_calls.0.tool_call.function.name": "order_status",
        "message.tool_calls.0.tool_call.function.arguments": _j(ARGS),
    }
    first = {
        "openinference.span.kind": "LLM",
        "llm.model_name": "fake-1",
        **msg(0, "user", content=QUESTION),
        "llm.output_messages.0.message.role": "assistant",
        **{f"llm.output_messages.0.{k}": v for k, v in call.items()},
        "llm.token_count.prompt": 11,
        "llm.token_count.completion": 5,
        "llm.token_count.total": 16,
    }
    second = {
        "openinference.span.kind": "LLM",
        "llm.model_name": "fake-1",
        **msg(0, "user", content=QUESTION),
        "llm.input_messages.1.message.role": "assistant",
        **{f"llm.input_messages.1.{k}": v for k, v in call.items()},
        **msg(2, "tool", content=_j(RESULT), tool_call_id="call_1"),
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": ANSWER,
        "llm.token_count.prompt": 20,
        "llm.token_count.completion": 6,
        "llm.token_count.total": 26,
    }
    tool = {
        "openinference.span.kind": "TOOL",
        "tool.name": "order_status",
        "tool.id": "call_1",
        "input.value": _j(ARGS),
        "output.value": _j(RESULT),
    }
    root = {"openinference.span.kind": "AGENT", "input.value": QUESTION, "output.value": ANSWER}
    return [
        span("b000000000000001", None, "agent", root, 0, 100, trace=trace),
        span("b000000000000002", "b000000000000001", "ChatCompletion", first, 1, 20, trace=trace),
        span("b000000000000003", "b000000000000001", "order_status", tool, 21, 30, trace=trace),
        span("b000000000000004", "b000000000000001", "ChatCompletion", second, 31, 80, trace=trace),
    ]
