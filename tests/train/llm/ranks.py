"""What each rank runs in the data-parallel tests, launched by torchrun: ``ranks.py MODE FOLDER``.

``step``: rank 0 leads an SFT step then a two-epoch GRPO step on `batch()`; the other ranks follow with
trainers they build from the config and `FOLDER/run`. ``train``: `sessionrl train` on a tiny run, the
other ranks following. Every rank saves the weights it ends with to ``FOLDER/rank<r>.safetensors``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from sessionrl.episodes import RolloutConfig
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig
from sessionrl.train.config import EnvSection, EvalSection, ModelSection, RLSection, RunConfig, SFTSection
from sessionrl.train.llm.data import TokenSequence
from sessionrl.train.llm.distributed import follow, join, lead, release, step_everywhere
from sessionrl.train.llm.grpo import GRPOConfig, GRPOTrainer
from sessionrl.train.llm.loop import train
from sessionrl.train.llm.sft import SFTConfig, SFTTrainer

TINY = TinyModelConfig(vocab_size=300, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32)
SFT = SFTConfig(lr=1e-2, warmup_steps=0, token_budget=64)
GRPO = GRPOConfig(lr=1e-2, token_budget=64, epochs=2)


def batch(vocab: int) -> list[TokenSequence]:
    """Sequences of uneven lengths, a random half of their tokens trained, with advantages of both signs
    and behaviour logprobs (one sequence without any, as a re-rendered reply)."""
    rng = random.Random(7)
    out = []
    for i in range(7):
        n = rng.randint(6, 20)
        mask = tuple(t > 2 and rng.random() < 0.5 for t in range(n))
        out.append(
            TokenSequence(
                input_ids=tuple(rng.randrange(3, vocab) for _ in range(n)),
                loss_mask=mask,
                old_logprobs=tuple(-rng.uniform(1, 6) if m else 0.0 for m in mask),
                advantages=tuple((1.0 if i % 2 else -0.5) if m else 0.0 for m in mask),
                session_id=f"s{i}",
                recorded=tuple(not m for m in mask) if i == 3 else None,
            )
        )
    return out


def lead_steps(config: RunConfig) -> dict[str, torch.Tensor]:
    """On rank 0: one SFT step, then a GRPO step of two epochs, then one on a single sequence (the other
    ranks' shards are empty), every rank taking them; the weights after them."""
    policy = HFPolicy.load(config.run_dir / "base")
    sequences = batch(len(policy.tokenizer))
    sft = lead(SFTTrainer(policy.model, SFT, 0))
    step_everywhere(sft, sequences)
    grpo = lead(GRPOTrainer(policy.model, GRPO, 0))
    step_everywhere(grpo, sequences)
    step_everywhere(grpo, sequences[:1])
    return dict(policy.model.state_dict())


def step_config(folder: Path) -> RunConfig:
    return RunConfig(
        run_dir=folder / "run",
        model=ModelSection(tiny=TINY),
        sft=SFTSection(trainer=SFT),
        rl=RLSection(trainer=GRPO),
    )


def tiny_run(folder: Path) -> RunConfig:
    return RunConfig(
        run_dir=folder / "run",
        env=EnvSection(train=16, dev=4, test=4),
        model=ModelSection(tiny=TINY),
        rollout=RolloutConfig(max_steps=3, full_schemas=False, domain_policy=False, max_tool_chars=120),
        sft=SFTSection(demos=4, trainer=SFTConfig(steps=3, batch_sessions=4, token_budget=1024)),
        rl=RLSection(
            iterations=1,
            tasks_per_iteration=2,
            sampling=SamplingConfig(max_new_tokens=12),
            trainer=GRPOConfig(group_size=2, token_budget=1024),
        ),
        evaluation=EvalSection(tasks=1, gate_tasks=1, max_new_tokens=8),
    )


def main(mode: str, folder: Path) -> None:
    torch.set_num_threads(1)
    config = step_config(folder) if mode == "step" else tiny_run(folder)
    rank = join()
    if rank != 0:
        followed = follow(config)
        assert followed.trainer is not None
        weights, steps = followed.trainer.model.state_dict(), followed.steps
    elif mode == "step":
        weights, steps = lead_steps(config), 3
        release()
    else:
        train(config)
        weights, steps = HFPolicy.load(config.run_dir / "rl_policy").model.state_dict(), -1
    tensors = {k: v.detach().contiguous().clone() for k, v in weights.items()}
    tensors["steps"] = torch.tensor(steps)
    save_file(tensors, str(folder / f"rank{rank}.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
