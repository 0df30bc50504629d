"""`sessionrl schema ...`: the session schema registry."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from sessionrl.session.schema import export_schemas

app = typer.Typer(help="Session schema versions.", no_args_is_help=True)


@app.command("export")
def export(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write the JSON Schemas into.")] = Path(
        "runs/schemas"
    ),
) -> None:
    """Write the JSON Schema of every session schema version."""
    console = Console()
    for path in export_schemas(out):
        console.print(f"wrote [bold]{path}[/bold]")
