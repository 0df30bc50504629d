"""`sessionrl serve`: the HTTP service on uvicorn (uvloop, httptools) over a durable SQLite store."""

from __future__ import annotations

import os
import secrets
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
import uvicorn
from prometheus_client import CollectorRegistry, start_http_server
from pydantic import ValidationError

from sessionrl.access import Scope
from sessionrl.cli.config_flags import FieldFlag, refused, with_field_flags, yaml_mapping
from sessionrl.cli.sessions import DEFAULT_DB, Db, store_url
from sessionrl.ops.serving import route_gateway
from sessionrl.orchestrator import PolicyBackend
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.service.config import TOKENS_ENV, TOKENS_FILE_ENV, shared_tokens

UPSTREAM_KEY_ENV = "SESSIONRL_UPSTREAM_KEY"


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s settings on top, nested mappings merged key by key."""
    out = dict(base)
    for name, value in over.items():
        below = out.get(name)
        out[name] = merged(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return out


SERVICE_FLAGS = (
    FieldFlag("skills", "skills_dir"),
    FieldFlag("rate", "rate_per_s"),
    FieldFlag("time_factor", "time_factor"),
    FieldFlag(
        "cache_sessions",
        "orchestrator.cache_size",
        "Size it to the sessions in flight: an evicted session is read again from the store.",
    ),
    FieldFlag("full_gc_every", "full_gc_every_s"),
    FieldFlag("upstream", "upstream_url", f"Its key comes from ${UPSTREAM_KEY_ENV}."),
    FieldFlag("ops", "ops"),
)
"""The service settings `serve` takes as flags, each typed, described and defaulted by its field."""


@with_field_flags(ServiceConfig, SERVICE_FLAGS)
def serve(
    db: Db = DEFAULT_DB,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8321,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A YAML file of the service's settings (`sessionrl.service.ServiceConfig`: limits, the "
            "orchestrator's guards such as free_form_tools, the gateway, traces, ops); flags override it.",
        ),
    ] = None,
    tokens: Annotated[
        str | None,
        typer.Option(
            "--tokens",
            help="Bearer tokens, 'tok1:read,write;tok2:read'. Default: $SESSIONRL_TOKENS, else "
            "--tokens-file, else a new one, printed.",
        ),
    ] = None,
    tokens_file: Annotated[
        Path | None,
        typer.Option(
            "--tokens-file",
            help="A file of tokens (token:scopes, one per line) that several serve processes share; "
            "created with one new read-write token when missing. Default: $SESSIONRL_TOKENS_FILE.",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "warning",
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
    proxy_headers: Annotated[
        bool,
        typer.Option(
            "--proxy-headers",
            help="Take client address and scheme from X-Forwarded-* headers (behind a proxy on this host).",
        ),
    ] = False,
    given_settings: dict[str, Any] | None = None,
) -> None:
    """Serve the session API and the OpenAI-compatible gateway (`/gateway/sessions/{id}/v1`).

    With `--policy`, the model answers the gateway and the steps that ask the policy; with `--upstream`,
    the gateway proxies to that server. With neither, plan steps need a `plan` in their payload.
    """
    flagged = given_settings or {}
    config = service_config(config_file, flagged, db_url=store_url(db), tokens=_tokens(tokens, tokens_file))
    backends: list[PolicyBackend] = []
    if policy is not None:
        from sessionrl.cli.train import quiet_model_loading
        from sessionrl.policy.llm import HFPolicy  # loads torch: only when a model is served

        quiet_model_loading(None)
        backends.append(HFPolicy.load(policy))
    app = create_app(config, backends=backends)
    if "ops" in flagged and config.upstream_url is None:
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


def service_config(config_file: Path | None, flagged: dict[str, Any], **fixed: object) -> ServiceConfig:
    """The `--config` file's settings, overridden by the flags' (nested settings merge) and `fixed`
    (those not None), with a new token printed when none is configured anywhere."""
    fields = yaml_mapping(config_file, "--config") if config_file is not None else {}
    fields = merged(fields, flagged)
    fields |= {name: value for name, value in fixed.items() if value is not None}
    if key := os.environ.get(UPSTREAM_KEY_ENV):
        fields["upstream_api_key"] = key
    try:
        config = ServiceConfig.from_env(**fields)
    except ValidationError as exc:
        raise refused(exc, SERVICE_FLAGS, flagged, "--config") from exc
    if config.tokens:
        return config
    token = secrets.token_urlsafe(24)
    print(f"no tokens given; use this one (read, write): {token}", file=sys.stderr)
    print(
        f"(this process's own: several processes share tokens through --tokens-file or ${TOKENS_ENV})",
        file=sys.stderr,
        flush=True,
    )
    return config.model_copy(update={"tokens": parse_tokens(f"{token}:read,write")})


def _tokens(flag: str | None, file: Path | None) -> dict[str, frozenset[Scope]] | None:
    """The tokens of `--tokens`; else, unless $SESSIONRL_TOKENS is set (the config reads it), those of
    `--tokens-file` or $SESSIONRL_TOKENS_FILE, made with a new token when missing (`shared_tokens`)."""
    if flag is not None:
        return parse_tokens(flag)
    if os.environ.get(TOKENS_ENV):
        return None
    env_file = os.environ.get(TOKENS_FILE_ENV)
    path = file or (Path(env_file) if env_file else None)
    if path is None:
        return None
    try:
        found, created = shared_tokens(path)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--tokens-file") from exc
    if created:
        print(f"wrote a new read-write token to {path}", file=sys.stderr, flush=True)
    return found


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
