"""The `sessionrl` command line: one typer app, one sub-app per part."""

from __future__ import annotations

import typer

from sessionrl.cli.rewards import app as rewards_app
from sessionrl.cli.schema import app as schema_app

app = typer.Typer(
    name="sessionrl",
    help="Agentic RL built around Decision Sessions: capture, store, reward, train, evaluate.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(schema_app, name="schema")
app.add_typer(rewards_app, name="rewards")
