"""Streaming through the gateway: an upstream's server-sent events passed on as they arrive, and the
model call recorded, put back together, when the stream ends.

Each chunk reaches the agent as the upstream sent it, but under the completion id the session records
(so feedback can name the call). The upstream is always asked for the usage, which the record keeps;
the agent gets the usage chunk only when it asked (`stream_options.include_usage`). A stream that ends
is recorded as answered; one the upstream breaks is recorded as failed with what had arrived, and the
agent is sent an OpenAI error event; one the agent leaves (it disconnects) is recorded as failed, cut
off, with what had arrived. The record is written even while the request is being cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson

from sessionrl.errors import SessionRLError
from sessionrl.gateway.backends import RETOKENISED, ChatReply, UpstreamError
from sessionrl.gateway.capture import record_llm
from sessionrl.gateway.chat import ChatRequest, error_body
from sessionrl.gateway.ending import finish_answered
from sessionrl.gateway.upstream import sampled_tokens
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.session.model import ToolRequest

log = logging.getLogger(__name__)
CUT_OFF = "cut off"
"""How the error of a call whose stream the agent left begins."""


class Assembly:
    """A streamed answer put back together from its chunks (of its first choice)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.model = ""
        self.usage: dict[str, int] = {}
        self.chunks = 0
        self.prompt_ids: tuple[int, ...] | None = None
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.tokens_whole = True
        """Whether every chunk carrying text gave its token ids (and log-probabilities)."""

    def add(self, chunk: dict[str, Any]) -> None:
        """Take one `chat.completion.chunk`: text, pieces of tool calls (by their index), the usage."""
        self.chunks += 1
        self.model = self.model or str(chunk.get("model") or "")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = {k: v for k, v in usage.items() if type(v) is int}
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            self._add_tokens(choice, chunk.get("prompt_token_ids"), bool(delta.get("content")))
            if isinstance(delta.get("content"), str):
                self.text.append(delta["content"])
            for piece in delta.get("tool_calls") or ():
                self._add_call(piece)

    def _add_tokens(self, choice: dict[str, Any], prompt: Any, has_text: bool) -> None:
        prompt_ids, ids, logprobs = sampled_tokens(choice, prompt)
        self.prompt_ids = self.prompt_ids or prompt_ids
        if ids is None:
            self.tokens_whole = self.tokens_whole and not has_text
            return
        self.token_ids += ids
        if logprobs is None:
            self.tokens_whole = False
        else:
            self.logprobs += logprobs

    def _add_call(self, piece: dict[str, Any]) -> None:
        slot = self.calls.setdefault(int(piece.get("index", 0)), {"id": "", "name": "", "arguments": ""})
        slot["id"] = str(piece.get("id") or slot["id"])
        function = piece.get("function") or {}
        slot["name"] += str(function.get("name") or "")
        slot["arguments"] += str(function.get("arguments") or "")

    def reply(self) -> ChatReply:
        """What arrived, as one answer (a tool call whose name never arrived is left out)."""
        calls = tuple(
            ToolRequest(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"] or "{}")
            for i, c in sorted(self.calls.items())
            if c["name"]
        )
        tokens = self.tokens_whole and bool(self.token_ids) and len(self.logprobs) == len(self.token_ids)
        return ChatReply(
            text="".join(self.text),
            tool_calls=calls,
            model=self.model,
            usage=self.usage,
            prompt_token_ids=self.prompt_ids if tokens else None,
            token_ids=tuple(self.token_ids) if tokens else None,
            logprobs=tuple(self.logprobs) if tokens else None,
        )


def event(value: dict[str, Any]) -> bytes:
    """One server-sent event carrying `value`."""
    return b"data: " + orjson.dumps(value) + b"\n\n"


async def relay(
    engine: Orchestrator,
    session_id: str,
    request: ChatRequest,
    call_id: str,
    chunks: AsyncIterator[dict[str, Any]],
    *,
    key: str | None = None,
    finish_on_answer: bool = False,
    started: float | None = None,
    token_source: str = RETOKENISED,
) -> AsyncIterator[bytes]:
    """Pass `chunks` on to the agent as events as they arrive, then record the call (see the module
    doc); the request's tool results were recorded before the stream opened, at `started` (a
    `time.perf_counter()` reading; default: now)."""
    started = time.perf_counter() if started is None else started
    assembly = Assembly()
    error: str | None = None
    try:
        async for chunk in chunks:
            assembly.add(chunk)
            if not chunk.get("choices") and "usage" in chunk and not request.include_usage:
                continue
            yield event({**chunk, "id": call_id})
        yield b"data: [DONE]\n\n"
    except UpstreamError as exc:
        error = exc.message
        yield event(error_body(exc.message, "upstream_error", "upstream_failed"))
    except (asyncio.CancelledError, GeneratorExit):
        error = f"{CUT_OFF}: the agent left the stream after {assembly.chunks} chunk(s)"
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await _closed(chunks)
            latency_ms = (time.perf_counter() - started) * 1000
            reply = assembly.reply()
            try:
                await record_llm(
                    engine,
                    session_id,
                    request,
                    call_id,
                    reply,
                    latency_ms,
                    key=key,
                    error=error,
                    token_source=token_source,
                )
                if error is None and finish_on_answer and not reply.tool_calls:
                    await finish_answered(engine, session_id, reply.text)
            except SessionRLError:  # the answer has gone out; the record could not be written
                log.exception("the streamed call %s of session %s was not recorded", call_id, session_id)


async def _closed(chunks: AsyncIterator[dict[str, Any]]) -> None:
    """Close the upstream's stream (its connection) if it is still open."""
    close = getattr(chunks, "aclose", None)
    if close is not None:
        await close()
