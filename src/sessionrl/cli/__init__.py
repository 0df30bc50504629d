"""The `sessionrl` command line: one typer app, one sub-app per part."""

from __future__ import annotations

import typer
from typer._click import Context
from typer.core import TyperOption

from sessionrl.cli import demo, store_demo
from sessionrl.cli.envs import app as envs_app
from sessionrl.cli.loop import loop_command
from sessionrl.cli.policies import app as policies_app
from sessionrl.cli.rewards import app as rewards_app
from sessionrl.cli.schema import app as schema_app
from sessionrl.cli.serve import serve
from sessionrl.cli.sessions import app as sessions_app
from sessionrl.cli.store import app as store_app
from sessionrl.cli.train import eval_command, train_command
from sessionrl.cli.ui import ui

_display_type = TyperOption.display_type_rich


def _flag_type(option: TyperOption, ctx: Context) -> str | None:
    """typer's rich help prints a value type after every option, flags included (`--json <bool>`,
    `--help <bool>`), although a flag takes no value; its plain help leaves it out, and so does this."""
    return None if option.is_flag else _display_type(option, ctx)


TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign,assignment]

app = typer.Typer(
    name="sessionrl",
    help="Agentic RL built around Decision Sessions: capture, store, reward, train, evaluate.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(schema_app, name="schema")
app.add_typer(rewards_app, name="rewards")
app.add_typer(sessions_app, name="sessions")
store_app.command("demo")(store_demo.command)
app.add_typer(store_app, name="store")
app.add_typer(envs_app, name="envs")
app.add_typer(policies_app, name="policies")
app.command("demo")(demo.command)
app.command("serve")(serve)
app.command("train")(train_command)
app.command("eval")(eval_command)
app.command("loop")(loop_command)
app.command("ui")(ui)
