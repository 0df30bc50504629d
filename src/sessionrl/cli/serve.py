"""`sessionrl serve`: the HTTP service on uvicorn (uvloop, httptools) over a durable SQLite store."""

from __future__ import annotations

import os
import secrets
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
import uvicorn
import yaml
from prometheus_client import CollectorRegistry, start_http_server

from sessionrl.cli.sessions import DEFAULT_DB, Db, store_url
from sessionrl.ops.serving import route_gateway
from sessionrl.orchestrator import OrchestratorConfig, PolicyBackend
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.service.collector import FULL_GC_EVERY_S

CACHE_SESSIONS = OrchestratorConfig.model_fields["cache_size"].default
UPSTREAM_KEY_ENV = "SESSIONRL_UPSTREAM_KEY"


def serve(
    db: Db = DEFAULT_DB,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8321,
    skills: Annotated[
        Path | None,
        typer.Option("--skills", help="Folder of YAML skill contracts, served as simulated skills."),
    ] = None,
    tokens: Annotated[
        str | None,
        typer.Option(
            "--tokens",
            help="Bearer tokens, 'tok1:read,write;tok2:read'. Default: $SESSIONRL_TOKENS, "
            "else a new one, printed.",
        ),
    ] = None,
    rate: Annotated[float, typer.Option("--rate", help="Requests per second allowed per token.")] = 2000.0,
    time_factor: Annotated[
        float, typer.Option("--time-factor", help="Wall seconds per simulated skill second.")
    ] = 1.0,
    cache_sessions: Annotated[
        int,
        typer.Option(
            "--cache-sessions",
            min=1,
            help="Active sessions kept in memory (LRU). Size it to the sessions in flight: a step whose "
            "session was evicted re-reads it from the store.",
        ),
    ] = CACHE_SESSIONS,
    full_gc_every: Annotated[
        float,
        typer.Option(
            "--full-gc-every",
            min=0.001,
            help="Seconds between full garbage collections; in between, collections skip objects that "
            "survived one.",
        ),
    ] = FULL_GC_EVERY_S,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "warning",
    upstream: Annotated[
        str | None,
        typer.Option(
            "--upstream",
            help="An OpenAI-compatible server (such as https://host/v1) the gateway proxies to; its key "
            "comes from $SESSIONRL_UPSTREAM_KEY.",
        ),
    ] = None,
    policy: Annotated[
        Path | None,
        typer.Option("--policy", help="A local Hugging Face causal LM folder that answers the gateway."),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            help="Also serve the Prometheus metrics on this port, on --host, without a token (a scrape "
            "sends none); the API's /metrics needs a read token.",
            show_default=False,
        ),
    ] = None,
    ops: Annotated[
        Path | None,
        typer.Option(
            "--ops",
            help="Operations config (YAML, `sessionrl.ops.config.OpsConfig`): the registry policy the gateway"
            " and the steps are routed to, canary rules, the alert webhook, fallback plans.",
        ),
    ] = None,
    proxy_headers: Annotated[
        bool,
        typer.Option(
            "--proxy-headers",
            help="Take client address and scheme from X-Forwarded-* headers (behind a proxy on this host).",
        ),
    ] = False,
) -> None:
    """Serve the session API and the OpenAI-compatible gateway (`/gateway/sessions/{id}/v1`).

    With `--policy`, the model answers the gateway and the steps that ask the policy; with `--upstream`,
    the gateway proxies to that server. With neither, plan steps need a `plan` in their payload.
    """
    fields: dict[str, object] = {
        "upstream_url": upstream,
        "upstream_api_key": os.environ.get(UPSTREAM_KEY_ENV),
        "db_url": store_url(db),
        "skills_dir": skills,
        "rate_per_s": rate,
        "rate_burst": max(1, int(rate * 2)),
        "time_factor": time_factor,
        "orchestrator": OrchestratorConfig(cache_size=cache_sessions),
        "full_gc_every_s": full_gc_every,
    }
    if tokens is not None:
        fields["tokens"] = parse_tokens(tokens)
    if ops is not None:
        fields["ops"] = yaml.safe_load(ops.read_text()) or {}
    config = ServiceConfig.from_env(**fields)
    if not config.tokens:
        token = secrets.token_urlsafe(24)
        config = config.model_copy(update={"tokens": parse_tokens(f"{token}:read,write")})
        print(f"no tokens given; use this one (read, write): {token}", file=sys.stderr, flush=True)
    backends: list[PolicyBackend] = []
    if policy is not None:
        from sessionrl.policy.llm import HFPolicy  # loads torch: only when a model is served

        backends.append(HFPolicy.load(policy))
    app = create_app(config, backends=backends)
    if ops is not None and upstream is None:
        route_gateway(app)
    server = ListeningServer(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            loop="uvloop",
            http="httptools",
            log_level=log_level,
            access_log=False,
            proxy_headers=proxy_headers,
            server_header=False,
            date_header=False,
        )
    )
    with metrics_without_token(app.state.metrics.registry, host, metrics_port):
        server.run()


@contextmanager
def metrics_without_token(registry: CollectorRegistry, host: str, port: int | None) -> Iterator[None]:
    """While the block runs, serve `registry` in the Prometheus text format on `host:port` to anyone who
    asks (any path), saying where on stderr; nothing when `port` is None. It is the same registry the
    API's `/metrics` renders, served by a small thread of its own."""
    if port is None:
        yield
        return
    metrics, _ = start_http_server(port, addr=host, registry=registry)
    shown = f"[{host}]" if ":" in host else host
    print(f"metrics on http://{shown}:{metrics.server_port}/metrics (no token)", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        metrics.shutdown()
        metrics.server_close()


class ListeningServer(uvicorn.Server):
    """uvicorn's server, saying on stderr where it listens once its socket is bound (uvicorn says it at
    info level only, which the default `--log-level warning` hides). With `--port 0` it names the port
    the system chose."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for listener in getattr(self, "servers", ()):
            for bound in listener.sockets:
                host, port = bound.getsockname()[:2]
                shown = f"[{host}]" if ":" in host else host
                print(f"listening on http://{shown}:{port}", file=sys.stderr, flush=True)
