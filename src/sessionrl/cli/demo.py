"""`sessionrl demo`: the main job. A tiny policy learns the orders domain by imitation, then by rejection
sampling (and GRPO with `--rl-iterations`), and both are evaluated on held-out tasks
(`sessionrl.train.llm.demo` says what runs and why the gain is honest).

The training stack is imported when the command runs, so `sessionrl --help` stays quick.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def command(
    out: Annotated[Path, typer.Option(help="Run folder, replaced on every run.")] = Path("runs/demo"),
    seed: Annotated[
        int, typer.Option(help="Seeds initialisation, faults, task draws and sampling (not the tasks).")
    ] = 0,
    rl_iterations: Annotated[
        int,
        typer.Option(min=0, help="GRPO iterations after rejection sampling (a budget in iterations)."),
    ] = 0,
    eval_tasks: Annotated[
        int, typer.Option(min=1, help="Held-out test tasks each policy is judged on.")
    ] = 100,
    threads: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Torch CPU threads (default: torch's); at one, a seed's run is the same in every process.",
        ),
    ] = None,
) -> None:
    """Imitation, then rejection sampling (and GRPO), on orders; the held-out metrics, the paired
    comparison and one JSON line."""
    from sessionrl.cli.train import quiet_model_loading

    quiet_model_loading(threads)
    from sessionrl.train.llm.demo import main

    main(out, seed=seed, rl_iterations=rl_iterations, eval_tasks=eval_tasks)
