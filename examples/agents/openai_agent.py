"""An ordinary tool-calling agent written with the official `openai` package, and nothing of sessionrl.

Pointed at the sessionrl gateway by its base URL, it is recorded without a change: every model call
becomes an LLM step of the session the URL names, every tool result it sends back a tool step.

    python examples/agents/openai_agent.py \
        --base-url http://127.0.0.1:8321/gateway/sessions/demo-1/v1 --api-key TOKEN \
        "Where is order O-1?"

Run that way, it offers one tool of its own (`lookup_order`, answered from a small table here); a
program that imports it calls `run_agent` with its own tools.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from openai import OpenAI

ToolFunction = Callable[[str, dict[str, Any]], Any]
"""Runs one tool call: the tool's name and its arguments in, its result (any JSON value) out."""


def run_agent(
    client: OpenAI,
    task: str,
    tools: Sequence[dict[str, Any]],
    call_tool: ToolFunction,
    *,
    model: str = "sessionrl-policy",
    system: str | None = None,
    max_turns: int = 16,
    metadata: Mapping[str, str] | None = None,
) -> str:
    """Ask the model, run the tools it calls, send their results back, until it answers in text.
    `metadata` (OpenAI's request metadata) goes with every request."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": task})
    extra = {"metadata": dict(metadata)} if metadata else {}
    for _ in range(max_turns):
        response = client.chat.completions.create(model=model, messages=messages, tools=list(tools), **extra)
        message = response.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments or "{}")
            try:
                result = call_tool(call.function.name, arguments)
            except Exception as exc:  # the model reads what went wrong, as it would read a result
                result = {"error": str(exc)}
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    return ""


ORDERS = {"O-1": {"status": "shipped", "eta": "tomorrow"}, "O-2": {"status": "packing", "eta": "Friday"}}
LOOKUP_ORDER = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Where an order is and when it arrives.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}


def lookup_order(name: str, arguments: dict[str, Any]) -> Any:
    """The demo's one tool."""
    if name != "lookup_order":
        raise ValueError(f"no tool named {name!r}")
    return ORDERS.get(arguments.get("order_id", ""), {"error": "no such order"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", help="What the user asks.")
    parser.add_argument("--base-url", required=True, help="The gateway, e.g. .../gateway/sessions/ID/v1.")
    parser.add_argument("--api-key", required=True, help="A sessionrl token with the write scope.")
    parser.add_argument("--model", default="sessionrl-policy")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    print(run_agent(client, args.task, [LOOKUP_ORDER], lookup_order, model=args.model))


if __name__ == "__main__":
    main()
