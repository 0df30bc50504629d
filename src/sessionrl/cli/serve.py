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
from pydantic import BaseModel

from sessionrl.access import Scope
from sessionrl.cli.sessions import DEFAULT_DB, Db, store_url
from sessionrl.ops.serving import route_gateway
from sessionrl.orchestrator import OrchestratorConfig, PolicyBackend
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.service.config import TOKENS_ENV, TOKENS_FILE_ENV, shared_tokens

UPSTREAM_KEY_ENV = "SESSIONRL_UPSTREAM_KEY"


def described(field: str, *, model: type[BaseModel] = ServiceConfig) -> str:
    """The help of the flag that sets `field`: the field's own description and default, so the two cannot
    drift apart."""
    info = model.model_fields[field]
    default = info.get_default(call_default_factory=True)
    return f"{info.description} [default: {default}]" if default is not None else str(info.description)


def given(**flags: object) -> dict[str, object]:
    """The flags a person gave (typer passes None for the others), by the config field each sets."""
    return {name: value for name, value in flags.items() if value is not None}


def mapping(value: object, where: str) -> dict[str, object]:
    """`value` as a mapping of settings (none: empty); anything else is a bad `--config`."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise typer.BadParameter(f"{where} must be a mapping of settings, not {type(value).__name__}")
    return {str(k): v for k, v in value.items()}


def settings(path: Path) -> dict[str, object]:
    """The service settings in the YAML file `path` (`--config`)."""
    return mapping(yaml.safe_load(path.read_text(encoding="utf-8")), str(path))


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
    skills: Annotated[Path | None, typer.Option("--skills", help=described("skills_dir"))] = None,
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
    rate: Annotated[float | None, typer.Option("--rate", help=described("rate_per_s"))] = None,
    time_factor: Annotated[float | None, typer.Option("--time-factor", help=described("time_factor"))] = None,
    cache_sessions: Annotated[
        int | None,
        typer.Option(
            "--cache-sessions",
            min=1,
            help=described("cache_size", model=OrchestratorConfig)
            + " Size it to the sessions in flight: an evicted session is read again from the store.",
        ),
    ] = None,
    full_gc_every: Annotated[
        float | None, typer.Option("--full-gc-every", min=0.001, help=described("full_gc_every_s"))
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "warning",
    upstream: Annotated[
        str | None,
        typer.Option(
            "--upstream", help=described("upstream_url") + f" Its key comes from ${UPSTREAM_KEY_ENV}."
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
    ops: Annotated[Path | None, typer.Option("--ops", help=described("ops") + " A YAML file.")] = None,
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
    fields = settings(config_file) if config_file is not None else {}
    fields |= given(
        db_url=store_url(db),
        skills_dir=skills,
        rate_per_s=rate,
        rate_burst=max(1, int(rate * 2)) if rate is not None else None,
        time_factor=time_factor,
        full_gc_every_s=full_gc_every,
        upstream_url=upstream,
        upstream_api_key=os.environ.get(UPSTREAM_KEY_ENV),
        tokens=_tokens(tokens, tokens_file),
        ops=(yaml.safe_load(ops.read_text()) or {}) if ops is not None else None,
    )
    if cache_sessions is not None:
        fields["orchestrator"] = mapping(fields.get("orchestrator"), "orchestrator") | {
            "cache_size": cache_sessions
        }
    config = ServiceConfig.from_env(**fields)
    if not config.tokens:
        token = secrets.token_urlsafe(24)
        config = config.model_copy(update={"tokens": parse_tokens(f"{token}:read,write")})
        print(f"no tokens given; use this one (read, write): {token}", file=sys.stderr)
        print(
            f"(this process's own: several processes share tokens through --tokens-file or ${TOKENS_ENV})",
            file=sys.stderr,
            flush=True,
        )
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
