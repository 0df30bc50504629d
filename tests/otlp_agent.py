"""A small tool-using agent written with the official `openai` package and traced by a standard
OpenTelemetry setup, run as its own process by the end-to-end trace test.

    python otlp_agent.py genai|openinference MODEL_BASE_URL QUESTION...

The model calls are traced by the named instrumentation (`opentelemetry-instrumentation-openai-v2`, or
`openinference-instrumentation-openai`); the agent traces its own run and tool calls in the same
conventions. Spans go out through the OTLP HTTP exporter, which reads where to send them and with
which headers from the `OTEL_EXPORTER_OTLP_*` environment variables only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from openai import OpenAI
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, Status, StatusCode, Tracer

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "order_status",
            "description": "Where an order is.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}}},
        },
    }
]


def order_status(order_id: int) -> dict[str, Any]:
    if order_id < 0:
        raise ValueError(f"no order {order_id}")
    return {"order_id": order_id, "status": "packed" if order_id % 2 else "shipped"}


def instrument(kind: str, provider: TracerProvider) -> None:
    if kind == "genai":
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]
    else:
        from openinference.instrumentation.openai import OpenAIInstrumentor as OpenInferenceInstrumentor

        OpenInferenceInstrumentor().instrument(tracer_provider=provider)


def tool_span(kind: str, tracer: Tracer, call: Any) -> tuple[Span, Callable[[str], None]]:
    """A span for one tool call in the agent's conventions, and how to record its result on it."""
    if kind == "genai":
        span = tracer.start_span(
            f"execute_tool {call.function.name}",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.function.name,
                "gen_ai.tool.call.id": call.id,
                "gen_ai.tool.call.arguments": call.function.arguments,
            },
        )
        return span, lambda result: span.set_attribute("gen_ai.tool.call.result", result)
    from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes

    span = tracer.start_span(
        call.function.name,
        attributes={
            SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.TOOL.value,
            SpanAttributes.TOOL_NAME: call.function.name,
            SpanAttributes.TOOL_ID: call.id,
            SpanAttributes.INPUT_VALUE: call.function.arguments,
        },
    )
    return span, lambda result: span.set_attribute(SpanAttributes.OUTPUT_VALUE, result)


def run_tool(kind: str, tracer: Tracer, call: Any) -> str:
    span, record = tool_span(kind, tracer, call)
    try:
        result = json.dumps(order_status(**json.loads(call.function.arguments)))
        record(result)
    except ValueError as exc:
        result = json.dumps({"error": str(exc)})
        span.set_status(Status(StatusCode.ERROR, str(exc)))
        span.set_attribute("error.type", type(exc).__name__)
    finally:
        span.end()
    return result


def answer(kind: str, client: OpenAI, tracer: Tracer, question: str) -> str:
    """One question: the model asks for tools until it answers; every step is traced."""
    root_attributes = (
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "shop"}
        if kind == "genai"
        else {"openinference.span.kind": "AGENT", "input.value": question}
    )
    with tracer.start_as_current_span("invoke_agent shop", attributes=root_attributes) as root:
        messages: list[Any] = [{"role": "user", "content": question}]
        for _ in range(4):
            reply = client.chat.completions.create(model="fake-1", messages=messages, tools=TOOLS)
            message = reply.choices[0].message
            if not message.tool_calls:
                if kind != "genai":
                    root.set_attribute("output.value", message.content or "")
                return message.content or ""
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": run_tool(kind, tracer, call)}
                )
        return ""


def main(kind: str, base_url: str, questions: list[str]) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": f"shop-agent-{kind}"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # configured by OTEL_EXPORTER_OTLP_*
    instrument(kind, provider)
    client = OpenAI(base_url=base_url, api_key="not-used", max_retries=0)
    tracer = provider.get_tracer("shop-agent")
    for question in questions:
        print(answer(kind, client, tracer, question), flush=True)
    provider.shutdown()  # flushes the batch processor


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
