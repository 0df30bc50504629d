"""A structured run from a `RunConfig` (`trainer: ppo` or `trainer: aaac`): imitation of the expert's plans,
the trainer's rounds on the environment's Gymnasium view, the exported policies and their evaluation.

Everything goes under the run folder::

    config.yaml              the validated config
    metrics.jsonl, tb/       the imitation loss per epoch (stage `imitation`), one record per round (stage
                             `ppo` or `aaac`) and one per evaluation (`eval`)
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
from sessionrl.envs.gym import StructuredEnv
from sessionrl.envs.prototypes import Prototype, expert_prototypes
from sessionrl.policy.encoder import TextEncoder, build_encoder
from sessionrl.policy.structured import StructuredPolicy, build_policy
from sessionrl.train.config import AAACSection, PPOSection, RunConfig, Trainer
from sessionrl.train.llm.run import MetricsLog
from sessionrl.train.structured.aaac import AAACConfig, train_aaac
from sessionrl.train.structured.imitation import imitate
from sessionrl.train.structured.ppo import PPOConfig, train_ppo
from sessionrl.train.structured.rollout import (
    IterationLog,
    StructuredRun,
    StructuredRunConfig,
    Summary,
    evaluate,
    gym_view,
)
from sessionrl.train.threads import torch_threads

STRUCTURED = frozenset({Trainer.PPO, Trainer.AAAC})
"""The trainers a structured run serves."""

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
    """An exported policy, rebuilt for `env` with the shape `run` gives (its state, risk critic and
    prototypes included), and its query encoder."""
    encoder = build_encoder(run.encoder, dim=run.text_dim)
    with gym_view(env, Split.TRAIN, seed=0, gym=run.gym, prototypes=run_prototypes(env, run)) as gym_env:
        policy = build_policy(
            gym_env,
            encoder.dim,
            run.hidden,
            state=run.state,
            risk_quantiles=run.risk_quantiles,
            cvar_alpha=run.cvar_alpha,
        )
    load_model(policy, str(folder / WEIGHTS))
    return policy, encoder


def run_prototypes(env: StructuredEnv, run: StructuredRunConfig) -> tuple[Prototype, ...]:
    """The macro-actions a run of shape `run` trains with (none unless ``run.prototypes``)."""
    return expert_prototypes(env, run.prototypes) if run.prototypes else ()


def round_record(log: IterationLog) -> dict[str, Any]:
    """One round's log as a flat metrics record."""
    record = dataclasses.asdict(log)
    train = record.pop("train")
    return record | {f"train_{name}": value for name, value in train.items()}


Trains = Callable[..., StructuredRun]
Settings = PPOConfig | AAACConfig


def _trainer(config: RunConfig) -> tuple[PPOSection | AAACSection, Settings, Trains]:
    """The section of a structured `config`, its trainer settings (seeded by the run's `seed`) and the
    training function."""
    section: PPOSection | AAACSection
    trains: Trains
    if config.trainer is Trainer.PPO and config.ppo is not None:
        section, trains = config.ppo, train_ppo
    elif config.trainer is Trainer.AAAC and config.aaac is not None:
        section, trains = config.aaac, train_aaac
    else:
        raise ValueError(f"trainer {config.trainer} is no structured trainer with its section set")
    settings = section.trainer
    return (
        section,
        dataclasses.replace(settings, run=dataclasses.replace(settings.run, seed=config.seed)),
        trains,
    )


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
    section, settings, trains = _trainer(config)
    run = settings.run
    env = _structured_env(config)
    folder = config.run_dir
    if (folder / "metrics.jsonl").exists():
        raise FileExistsError(f"{folder} already holds a run; choose another run_dir")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(config.dump(), encoding="utf-8")
    log = MetricsLog(folder)
    try:
        # imitation
        start = None
        if section.imitation is not None:
            with console.status("imitation"):
                start = imitate(
                    env,
                    run,
                    section.imitation,
                    on_epoch=lambda epoch, loss: log.write("imitation", epoch, {"loss": loss}),
                ).policy
            export_policy(start, folder / "imitation_policy")
        # rounds
        name = str(config.trainer)
        with console.status(name) as status:

            def on_log(round_log: IterationLog) -> None:
                log.write(name, round_log.iteration, round_record(round_log))
                status.update(f"{name}: round {round_log.iteration + 1}/{run.iterations}")

            trained = trains(env, settings, policy=start, on_log=on_log)
        export_policy(trained.policy, folder / f"{name}_policy")
        # evaluation
        report = evaluate_exported(config, config.evaluation.split, config.evaluation.tasks, env)
        for label, summary in report.items():
            log.write("eval", 0, {"label": label, **dataclasses.asdict(summary)})
    finally:
        log.close()
    return StructuredResult(config.trainer, trained.history, report)


def evaluate_exported(
    config: RunConfig, split: Split, n_tasks: int, env: StructuredEnv | None = None
) -> dict[str, Summary]:
    """The run's exported policies (`imitation_policy/`, then `<trainer>_policy/`, where present), each
    evaluated greedily on the first `n_tasks` tasks of `split`; keyed by label."""
    run = _trainer(config)[1].run
    env = env or _structured_env(config)
    report = {}
    for label in ("imitation", str(config.trainer)):
        folder = config.run_dir / f"{label}_policy"
        if (folder / WEIGHTS).is_file():
            policy, encoder = load_policy(env, run, folder)
            with torch_threads(run.threads):
                episodes = evaluate(
                    policy,
                    encoder,
                    env,
                    split,
                    gym=run.gym,
                    seed=config.seed,
                    limit=n_tasks,
                    prototypes=run_prototypes(env, run),
                )
            report[label] = Summary.of(episodes)
    return report


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
    "STRUCTURED",
    "WEIGHTS",
    "StructuredResult",
    "evaluate_exported",
    "export_policy",
    "load_policy",
    "round_record",
    "run_prototypes",
    "summary_table",
    "train_structured",
]
