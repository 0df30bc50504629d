"""One entry point for every trainer: `run_trainer(config)` runs what `config.trainer` names.

    sft    imitation on expert sessions                     sessionrl.train.llm.loop.train_sft
    grpo   imitation, a gate, then GRPO                     sessionrl.train.llm.loop.train
    dpo    imitation, outcome preference pairs, then DPO    sessionrl.train.llm.preferences.train_dpo
    rft    imitation, then rejection-sampling fine-tuning   sessionrl.train.llm.rft.train_rft
    ppo    structured imitation, then PPO                   sessionrl.train.structured.run.train_structured
    aaac   structured imitation, then AAAC                  sessionrl.train.structured.run.train_structured

A config with `stages:` runs the grpo loop stage by stage (`sessionrl.train.llm.reflection.train_stages`;
`[imitation, rl, reflection]` adds reflection as stage 3) and reports each stage; it resumes from the
loop's last checkpoint, and runs reflection again from the RL policy.

Each writes under `config.run_dir` (config.yaml, metrics.jsonl, the exported policies, and status.json:
running, finished, paused or failed, see `sessionrl.train.status`) and ends with an evaluation of what it
exported. Only the LLM loop (`sft`, `grpo`) keeps checkpoints, so only it resumes.
"""

from __future__ import annotations

from rich.console import Console

from sessionrl.train.config import RunConfig, Trainer
from sessionrl.train.llm.loop import TrainResult, train, train_sft
from sessionrl.train.llm.preferences import train_dpo
from sessionrl.train.llm.reflection import StagesResult, train_stages
from sessionrl.train.llm.rft import train_rft
from sessionrl.train.status import recording
from sessionrl.train.structured.run import StructuredResult, train_structured

RESUMABLE = frozenset({Trainer.SFT, Trainer.GRPO})
"""Trainers whose runs keep checkpoints and can be resumed."""


def run_trainer(
    config: RunConfig, *, resume: bool = False, console: Console | None = None
) -> TrainResult | StructuredResult | StagesResult:
    """Run (or, with `resume`, continue) the trainer `config` names; see the module doc."""
    console = console or Console()
    if resume and config.trainer not in RESUMABLE:
        raise ValueError(
            f"trainer {config.trainer} keeps no checkpoint to resume; only sft and grpo runs resume"
        )
    with recording(config.run_dir) as outcome:
        result = _run(config, resume, console)
        trained = result.train if isinstance(result, StagesResult) else result
        outcome["stage"] = str(trained.stage) if isinstance(trained, TrainResult) else None
    return result


def _run(config: RunConfig, resume: bool, console: Console) -> TrainResult | StructuredResult | StagesResult:
    if config.stages is not None:
        return train_stages(config, resume=resume, console=console)
    match config.trainer:
        case Trainer.SFT:
            return train_sft(config, resume=resume, console=console)
        case Trainer.GRPO:
            return train(config, resume=resume, console=console)
        case Trainer.DPO:
            return train_dpo(config, console=console)
        case Trainer.RFT:
            return train_rft(config, console=console)
        case Trainer.PPO | Trainer.AAAC:
            return train_structured(config, console=console)


__all__ = ["RESUMABLE", "run_trainer"]
