"""Shared pieces of the gateway tests: a server on loopback, and the examples' orders desk (the domain's
tools for an agent, and a scripted chat backend that solves its tasks with real tool calls)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from example_agents_support import load_example
from sessionrl.service import ServiceConfig, create_app, parse_tokens

REPO = Path(__file__).resolve().parents[2]
WRITER = "gateway-writer"
TOKENS = parse_tokens(f"{WRITER}:read,write")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving_on_loopback(app: Any) -> Iterator[str]:
    """`app` served by uvicorn on a free loopback port in a thread; yields its root URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def gateway_app(db_url: str, **kwargs: Any) -> Any:
    """A service (no skills of its own) whose gateway answers with `kwargs['chat']` or the config's."""
    names = ("upstream_url", "upstream_api_key", "rate_per_s", "rate_burst", "gateway", "max_body_bytes")
    fields = {k: kwargs.pop(k) for k in names if k in kwargs}
    config = ServiceConfig(db_url=db_url, tokens=TOKENS, **fields)
    return create_app(config, skills=[], **kwargs)


OrdersDesk: Any = load_example("gateway_demo").OrdersDesk
"""The orders domain as an agent sees it, with a scripted model that calls the expert's tools."""
