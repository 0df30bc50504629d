"""The gateway's upstream: an OpenAI-compatible server (vLLM, SGLang, a hosted API) it proxies to.

`UpstreamChat` sends each chat request on and reads what the answer says (`parse_completion`), or the
server-sent events of a streamed one as they arrive. Every request an agent sends through a proxying
gateway makes this hop, so it runs on aiohttp, whose HTTP parser is compiled: on this project's 2-core
machine a request costs its client 0.17 ms of CPU against 0.75 ms with a pure-Python HTTP/1.1 client, and
the gateway's CPU per proxied request fell from 2.8 to 1.8 ms (`bench/gateway.py`). A failure on the way
is an `UpstreamError` with the status the agent is told (`upstream_status`).
"""

from __future__ import annotations

import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import orjson

from sessionrl.gateway.backends import RETOKENISED, UPSTREAM, ChatReply, UpstreamError
from sessionrl.gateway.chat import ChatRequest
from sessionrl.session.model import ToolRequest

READ_BUFFER = 1 << 20
"""Bytes read ahead from the upstream; a server-sent event's line may be up to twice as long."""


class UpstreamChat:
    """Proxies to an OpenAI-compatible server at `base_url` (such as `https://host/v1`). With
    `token_ids`, each request also asks for the sampled token ids and their log-probabilities, as vLLM's
    OpenAI server gives them (`return_token_ids`, `logprobs`; `return_tokens_as_token_ids` for a server
    that spells the ids in its log-probabilities only), and the answer's are recorded, so training uses
    them as they were sampled.

    `timeout_s` bounds the connection (a free one from the pool included) and each wait for more of an
    answer, not the whole answer: a long stream that keeps sending is never cut. The connection pool is
    opened on first use, in the event loop of the service that uses it. A proxy the environment names
    for `base_url` (`env_proxy`) is used.
    """

    def __init__(
        self, base_url: str, *, api_key: str | None = None, timeout_s: float = 120.0, token_ids: bool = False
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_read=timeout_s)
        self._proxy = env_proxy(self.base_url)
        self._http: aiohttp.ClientSession | None = None
        self.token_ids = token_ids
        self.token_source = UPSTREAM if token_ids else RETOKENISED

    def _pool(self) -> aiohttp.ClientSession:
        """The connection pool, opened on first use (it belongs to the running event loop)."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                headers=self._headers, timeout=self._timeout, read_bufsize=READ_BUFFER, proxy=self._proxy
            )
        return self._http

    def _body(self, request: ChatRequest) -> dict[str, Any]:
        """The request as the upstream gets it (asking for token ids when configured to)."""
        body = request.model_dump(mode="json", exclude_none=True)
        if self.token_ids:
            body |= {"return_token_ids": True, "return_tokens_as_token_ids": True}
            body.setdefault("logprobs", True)
        return body

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._http is not None:
            await self._http.close()

    async def complete(self, request: ChatRequest, session_id: str) -> ChatReply:
        body = self._body(request) | {"stream": False}
        body.pop("stream_options", None)
        response = await self._send(body)
        with _failures("did not answer in time", "did not answer"):
            async with response:
                raw = await response.read()
        try:
            return parse_completion(orjson.loads(raw))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise UpstreamError(502, f"the upstream server's answer is not a chat completion: {exc}") from exc

    async def open_stream(self, request: ChatRequest) -> AsyncIterator[dict[str, Any]]:
        """The upstream's streamed answer, its `chat.completion.chunk`s as they arrive (the upstream is
        always asked for the usage, which the record keeps); `UpstreamError` when it refuses to start.
        Closing the iterator closes the connection."""
        body = self._body(request) | {"stream": True, "stream_options": {"include_usage": True}}
        return _chunks(await self._send(body))

    async def _send(self, body: dict[str, Any]) -> aiohttp.ClientResponse:
        """POST a chat request; its answer once the status says it is one (else `UpstreamError`)."""
        with _failures("did not answer in time", "did not answer"):
            response = await self._pool().post(f"{self.base_url}/chat/completions", data=orjson.dumps(body))
            if response.status >= 400:
                async with response:
                    raw = await response.read()
                raise UpstreamError(
                    upstream_status(response.status),
                    f"the upstream server answered {response.status}: {_message(response.status, raw)}",
                )
        return response

    async def models(self) -> list[str]:
        try:
            async with self._pool().get(f"{self.base_url}/models") as response:
                response.raise_for_status()
                return [str(m["id"]) for m in orjson.loads(await response.read())["data"]]
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
            return []


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (`HTTPS_PROXY` or `HTTP_PROXY` by its scheme, unless
    `NO_PROXY` exempts its host), read once: the pool does not look at the environment per request."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


@contextmanager
def _failures(late: str, broken: str) -> Iterator[None]:
    """The upstream's timeouts as a 504 saying it `late`, and its other transport failures as a 502
    saying it `broken`."""
    try:
        yield
    except TimeoutError as exc:
        raise UpstreamError(504, f"the upstream server {late}: {exc!r}") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamError(502, f"the upstream server {broken}: {exc!r}") from exc


async def _chunks(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON of each server-sent event of a streamed answer until `[DONE]`; `UpstreamError` when the
    stream breaks or carries what is not JSON. At the end the connection goes back to the pool; when the
    caller stops reading first, or the stream fails, it is closed, so the upstream stops generating."""
    ended = False
    try:
        with _failures("stopped streaming", "stream broke"):
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                value = orjson.loads(data)
                if isinstance(value, dict):
                    yield value
        ended = True
    except orjson.JSONDecodeError as exc:
        raise UpstreamError(502, f"the upstream server streamed what is not JSON: {exc}") from exc
    except ValueError as exc:  # aiohttp's reader refuses a line longer than its buffer allows
        raise UpstreamError(502, f"the upstream server streamed a line too long to read: {exc}") from exc
    finally:
        if ended:
            response.release()
        else:
            response.close()


def upstream_status(status: int) -> int:
    """What the agent is told of an upstream's error status: a request the upstream refused (4xx) as it
    is, but its refusal of the gateway's own key (401, 403) and every server error are the upstream's
    failure (502; 504 for its timeouts).

    >>> [upstream_status(s) for s in (400, 401, 429, 500, 503, 504)]
    [400, 502, 429, 502, 502, 504]
    """
    if status in (408, 504):
        return 504
    return 502 if status in (401, 403) or status >= 500 else status


def _message(status: int, raw: bytes) -> str:
    """The message of an error answer: its OpenAI error's message, or its start."""
    try:
        error = orjson.loads(raw)["error"]
        return str(error["message"] if isinstance(error, dict) else error)
    except (ValueError, KeyError, TypeError):
        return f"{status} {raw[:200].decode(errors='replace')}"


def sampled_tokens(
    choice: dict[str, Any], prompt: Any
) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None, tuple[float, ...] | None]:
    """The prompt's token ids, the sampled ones and their log-probabilities, as far as a choice of an
    answer (or of a streamed chunk) gives them: vLLM's `token_ids` (and the answer's
    `prompt_token_ids`), or ids spelled `token_id:N` in its log-probabilities; log-probabilities only
    with as many ids.

    >>> choice = {"logprobs": {"content": [{"token": "token_id:7", "logprob": -0.5}]}}
    >>> sampled_tokens(choice, [1, 2])
    ((1, 2), (7,), (-0.5,))
    """
    content = (choice.get("logprobs") or {}).get("content") or []
    entries = [c for c in content if isinstance(c, dict)]
    ids = choice.get("token_ids")
    if ids is None and entries and all(str(c.get("token", "")).startswith("token_id:") for c in entries):
        ids = [int(str(c["token"]).removeprefix("token_id:")) for c in entries]
    token_ids = tuple(int(t) for t in ids) if isinstance(ids, list) else None
    logprobs = tuple(float(c["logprob"]) for c in entries if "logprob" in c)
    matched = logprobs if token_ids is not None and len(logprobs) == len(token_ids) else None
    prompt_ids = tuple(int(t) for t in prompt) if isinstance(prompt, list) else None
    return prompt_ids, token_ids, matched


def parse_completion(answer: dict[str, Any]) -> ChatReply:
    """What a `chat.completion` answer says: its first choice's text and tool calls, model and usage,
    and the tokens it was sampled as when the server gives them (`sampled_tokens`)."""
    choice = answer["choices"][0]
    message = choice["message"]
    calls = tuple(
        ToolRequest(id=c["id"], name=c["function"]["name"], arguments=c["function"].get("arguments") or "{}")
        for c in message.get("tool_calls") or ()
    )
    usage = {k: int(v) for k, v in (answer.get("usage") or {}).items() if isinstance(v, int)}
    prompt_ids, token_ids, logprobs = sampled_tokens(choice, answer.get("prompt_token_ids"))
    return ChatReply(
        text=message.get("content") or "",
        tool_calls=calls,
        model=str(answer.get("model", "")),
        usage=usage,
        prompt_token_ids=prompt_ids,
        token_ids=token_ids,
        logprobs=logprobs,
    )
