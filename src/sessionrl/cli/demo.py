"""`sessionrl demo`: the main job. A tiny policy learns the orders domain by imitation, then by GRPO, and
both are evaluated on held-out tasks (`sessionrl.train.llm.demo` says what runs and why the gain is honest).

The training stack is imported when the command runs, so `sessionrl --help` stays quick.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def command(
    out: Annotated[Path, typer.Option(help="Run folder, replaced on every run.")] = Path("runs/demo"),
    rl_minutes: Annotated[
        float, typer.Option(min=0.1, help="Wall-clock budget of the GRPO stage, in minutes.")
    ] = 2.5,
    eval_tasks: Annotated[
        int, typer.Option(min=1, help="Held-out test tasks each policy is judged on.")
    ] = 100,
) -> None:
    """Imitation, then GRPO, on orders; the learning curve, the held-out metrics and one JSON line."""
    from sessionrl.train.llm.demo import main

    main(out, rl_minutes=rl_minutes, eval_tasks=eval_tasks)
