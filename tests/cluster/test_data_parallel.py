"""One data-parallel update on 2 gloo ranks moves the parameters as one process does on the whole batch."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from sessionrl.cluster.distributed import follow, spawn
from sessionrl.episodes import RolloutConfig
from sessionrl.policy.llm import SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_model, train_tokenizer
from sessionrl.train.config import EnvSection, EvalSection, ModelSection, RLSection, RunConfig, SFTSection
from sessionrl.train.llm.checkpoint import read_state
from sessionrl.train.llm.data import TokenSequence, shard
from sessionrl.train.llm.grpo import GRPOConfig, GRPOTrainer
from sessionrl.train.llm.loop import train
from sessionrl.train.llm.sft import SFTConfig, SFTTrainer

pytestmark = pytest.mark.slow
TINY = TinyModelConfig(vocab_size=300, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32)
PAD = 0
SFT = SFTConfig(lr=1e-2, warmup_steps=0, token_budget=64)
GRPO = GRPOConfig(lr=1e-2, token_budget=64, epochs=2)


def batch(vocab: int) -> list[TokenSequence]:
    """Sequences of uneven lengths, a random half of their tokens trained, with advantages of both signs."""
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
            )
        )
    return out


def update(model: LlamaForCausalLM, sequences: list[TokenSequence]) -> dict[str, torch.Tensor]:
    """One SFT step, then one GRPO step of two epochs; the weights after them."""
    SFTTrainer(model, SFT, PAD).step(sequences)
    GRPOTrainer(model, GRPO, PAD).step(sequences)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def rank_update(rank: int, world: int, folder: Path) -> None:
    model = LlamaForCausalLM.from_pretrained(folder / "model")
    torch.save(update(model, batch(model.config.vocab_size)), folder / f"rank{rank}.pt")


def test_two_ranks_take_the_step_one_process_takes_on_the_whole_batch(tmp_path: Path) -> None:
    tokenizer = train_tokenizer(["a tiny corpus of words for a tiny tokenizer"], TINY)
    build_tiny_model(TINY, tokenizer).save_pretrained(tmp_path / "model")
    single = update(LlamaForCausalLM.from_pretrained(tmp_path / "model"), batch(len(tokenizer)))

    spawn(rank_update, 2, tmp_path)

    initial = LlamaForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    for rank in (0, 1):
        ranked = torch.load(tmp_path / f"rank{rank}.pt")
        assert ranked.keys() == single.keys()
        for name, value in single.items():
            torch.testing.assert_close(ranked[name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert any(not torch.equal(single[k], initial[k]) for k in single), "the update moved nothing"


def test_the_ranks_split_a_batch_without_overlap_or_loss() -> None:
    lengths = [len(s) for s in batch(300)]
    shares = [shard(lengths, rank, 3) for rank in range(3)]
    assert sorted(i for share in shares for i in share) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in share) for share in shares]
    assert max(loads) - min(loads) <= max(lengths)


def tiny_run(folder: Path) -> RunConfig:
    return RunConfig(
        run_dir=folder,
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


def rank_train(rank: int, world: int, folder: Path) -> None:
    """Rank 0 runs `sessionrl train`; rank 1 follows it, as it would under torchrun."""
    if rank == 0:
        train(tiny_run(folder / "run"))
        return
    followed = follow()
    assert followed.trainer is not None
    model = followed.trainer.model  # type: ignore[attr-defined]
    torch.save({"steps": followed.steps, "weights": model.state_dict()}, folder / "follower.pt")


def test_train_on_two_ranks_updates_both_in_step(tmp_path: Path) -> None:
    spawn(rank_train, 2, tmp_path)

    state = read_state(tmp_path / "run" / "checkpoint")
    assert state is not None
    assert state.updates > 0
    follower = torch.load(tmp_path / "follower.pt")
    assert follower["steps"] == 3 + state.updates
    leader = LlamaForCausalLM.from_pretrained(tmp_path / "run" / "rl_policy").state_dict()
    for name, value in leader.items():
        torch.testing.assert_close(follower["weights"][name], value, rtol=1e-4, atol=1e-5, msg=name)
