"""A structured run from a `RunConfig` (`trainer: ppo` or `trainer: aaac`): imitation of the expert's plans,
the trainer's rounds on the environment's Gymnasium view, the exported policies and their evaluation.

Everything goes under the run folder::

    config.yaml              the validated config
    metrics.jsonl, tb/       one record per round (stage `ppo` or `aaac`) and one per evaluation (`eval`)
    imitation_policy/        the cloned policy's weights (model.safetensors), when imitation is configured
    <trainer>_policy/        the trained policy's weights; `load_policy` rebuilds either

The run's top-level `seed` seeds it (it is the trainer's `run.seed`). The report evaluates each exported
policy greedily on the first `evaluation.tasks` tasks of `evaluation.split`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rich.console import Console
from rich.table import Table
from safetensors.torch import load_model, save_model

from sessionrl.envs.base import Split
from sessionrl.envs.gym import DecisionGymEnv, StructuredEnv
from sessionrl.policy.encoder import TextEncoder, build_encoder
from sessionrl.policy.structured import StructuredPolicy, build_policy
from sessionrl.train.config import AAACSection, PPOSection, RunConfig, Trainer
from sessionrl.train.llm.run import MetricsLog
from sessionrl.train.structured.aaac import train_aaac
from sessionrl.train.structured.imitation import imitate
from sessionrl.train.structured.ppo import train_ppo
from sessionrl.train.structured.rollout import (
    IterationLog,
    StructuredRun,
    StructuredRunConfig,
    Summary,
    evaluate,
    torch_threads,
)

WEIGHTS = "model.safetensors"
"""File of an exported policy's weights, in its folder."""


@dataclass(frozen=True)
class StructuredResult:
    """What a structured run produced: the trainer, one log per round, and the report (each exported
    policy's evaluation, by label: `imitation`, then the trainer's name)."""

    trainer: Trainer
    history: tuple[IterationLog, ...]
    report: dict[str, Summary]


def export_policy(policy: StructuredPolicy, folder: Path) -> Path:
    """Save the policy's weights to `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    save_model(policy, str(folder / WEIGHTS))
    return folder


def load_policy(
    env: StructuredEnv, run: StructuredRunConfig, folder: Path
) -> tuple[StructuredPolicy, TextEncoder]:
    """An exported policy, rebuilt for `env` with the shape `run` gives, and its query encoder."""
    encoder = build_encoder(run.encoder, dim=run.text_dim)
    with DecisionGymEnv(env, Split.TRAIN, config=run.gym) as gym_env:
        policy = build_policy(gym_env, encoder.dim, run.hidden)
    load_model(policy, str(folder / WEIGHTS))
    return policy, encoder


def round_record(log: IterationLog) -> dict[str, Any]:
    """One round's log as a flat metrics record."""
    record = dataclasses.asdict(log)
    train = record.pop("train")
    return record | {f"train_{name}": value for name, value in train.items()}


Trains = Callable[..., StructuredRun]


def _trainer(config: RunConfig) -> tuple[PPOSection | AAACSection, Trains]:
    """The section and the training function of a structured `config`."""
    if config.trainer is Trainer.PPO and config.ppo is not None:
        return config.ppo, train_ppo
    if config.trainer is Trainer.AAAC and config.aaac is not None:
        return config.aaac, train_aaac
    raise ValueError(f"trainer {config.trainer} is no structured trainer with its section set")


def _structured_env(config: RunConfig) -> StructuredEnv:
    env = config.env.build()
    if not hasattr(env, "feature_names"):
        raise ValueError(
            f"trainer {config.trainer} needs an environment with a Gymnasium view (a StructuredEnv: feature"
            f" names and structured episodes); {env.name} has none"
        )
    return cast(StructuredEnv, env)  # checked above


def train_structured(config: RunConfig, *, console: Console | None = None) -> StructuredResult:
    """`trainer: ppo` / `trainer: aaac`: imitation (when configured), the trainer's rounds, the exported
    policies and the report (see the module doc)."""
    console = console or Console()
    section, trains = _trainer(config)
    settings = section.trainer
    run = dataclasses.replace(settings.run, seed=config.seed)
    settings = dataclasses.replace(settings, run=run)
    env = _structured_env(config)
    folder = config.run_dir
    if (folder / "metrics.jsonl").exists():
        raise FileExistsError(f"{folder} already holds a run; choose another run_dir")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(config.dump(), encoding="utf-8")
    log = MetricsLog(folder)
    try:
        exported: dict[str, Path] = {}
        start = None
        if section.imitation is not None:
            # imitation
            with console.status("imitation"):
                start = imitate(env, run, section.imitation).policy
            exported["imitation"] = export_policy(start, folder / "imitation_policy")
        # rounds
        name = str(config.trainer)
        with console.status(name) as status:

            def on_log(round_log: IterationLog) -> None:
                log.write(name, round_log.iteration, round_record(round_log))
                status.update(f"{name}: round {round_log.iteration + 1}/{run.iterations}")

            trained = trains(env, settings, policy=start, on_log=on_log)
        exported[name] = export_policy(trained.policy, folder / f"{name}_policy")
        # evaluation
        report = {label: _evaluated(config, env, run, path, log, label) for label, path in exported.items()}
    finally:
        log.close()
    return StructuredResult(config.trainer, trained.history, report)


def _evaluated(
    config: RunConfig, env: StructuredEnv, run: StructuredRunConfig, folder: Path, log: MetricsLog, label: str
) -> Summary:
    """The exported policy in `folder`, evaluated greedily on the report's tasks and logged."""
    policy, encoder = load_policy(env, run, folder)
    split, tasks = config.evaluation.split, config.evaluation.tasks
    with torch_threads(run.threads):
        summary = Summary.of(
            evaluate(policy, encoder, env, split, gym=run.gym, seed=config.seed, limit=tasks)
        )
    log.write("eval", 0, {"label": label, **dataclasses.asdict(summary)})
    return summary


def summary_table(report: Mapping[str, Summary], title: str) -> Table:
    """The report as a table: completion, policy steps per task and the risky-call share, by policy."""
    table = Table(title=title)
    for column in ("policy", "episodes", "completion", "steps / task", "risky share"):
        table.add_column(column, justify="right")
    for label, summary in report.items():
        table.add_row(
            label,
            str(summary.episodes),
            f"{summary.completion:.3f}",
            f"{summary.mean_steps:.2f}",
            f"{summary.risk_share:.4f}",
        )
    return table


__all__ = [
    "WEIGHTS",
    "StructuredResult",
    "export_policy",
    "load_policy",
    "round_record",
    "summary_table",
    "train_structured",
]
