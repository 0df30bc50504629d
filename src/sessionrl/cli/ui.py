"""`sessionrl ui`: the dashboard alone over a store and a runs folder, for browsing (no step API)."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Annotated

import typer
import uvicorn

from sessionrl.cli.sessions import DEFAULT_DB, Db, open_store, reporting, store_url
from sessionrl.errors import require_extra
from sessionrl.service.config import TOKENS_ENV, parse_tokens


def ui(
    db: Db = DEFAULT_DB,
    runs: Annotated[Path, typer.Option("--runs", help="Folder of training runs.")] = Path("runs"),
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8322,
    skills: Annotated[
        Path | None, typer.Option("--skills", help="Folder of skill contracts; their SLAs label tool calls.")
    ] = None,
    tokens: Annotated[
        str | None,
        typer.Option(
            "--tokens", help=f"Bearer tokens, 'tok1:read'. Default: ${TOKENS_ENV}, else a new one, printed."
        ),
    ] = None,
) -> None:
    """Browse sessions, rewards and training runs at http://HOST:PORT/ui (log in with a read token)."""
    with reporting():
        require_extra("the dashboard", "ui", "jinja2")
    from sessionrl.ui import UIConfig, create_ui_app  # needs jinja2

    open_store(db, create=False).close()  # a store that does not exist is an error, not a new empty one
    text = tokens if tokens is not None else os.environ.get(TOKENS_ENV)
    table = parse_tokens(text) if text else {}
    if not table:
        token = secrets.token_urlsafe(24)
        table = parse_tokens(f"{token}:read")
        print(f"no tokens given; log in with this one (read): {token}", file=sys.stderr, flush=True)
    app = create_ui_app(store_url(db), UIConfig(runs_dir=runs, skills_dir=skills), table)
    print(f"dashboard on http://{host}:{port}/ui", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
