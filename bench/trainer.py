"""Policy-update throughput of our GRPO step against TRL's GRPOTrainer, and padding of token-budget packing.

Both trainers update the same tiny model (built here from the orders domain's texts) on the same batch:
TRL samples completions for real orders prompts (the prompt of the last policy call of expert-shaped
sessions: system prompt, request, earlier actions and tool answers), and we turn exactly those tokens
into our sequences. Timed is one policy update each (forward, clipped loss, backward, optimiser step),
not the sampling. TRL runs on the CPU with `use_cpu=True, bf16=False`. Ours runs twice: as it trains,
each group's shared prompt computed once (`sessionrl.train.llm.prefixes`), and with every sequence
computed whole (`share_prefixes=False`), so the gain of sharing reads apart from that of packing.

Tokens per second count the same tokens for every trainer: the batch's real (unpadded) prompt and
completion tokens, a prompt once per completion, as TRL computes them (TRL's `prompt_mask` plus
`completion_mask`). Ours computes fewer where prefixes are shared; that count (`computed_tokens`) is
printed apart and no rate is taken of it.

The second measure lays out real session lengths (imitation sequences of the orders domain) three ways and
reports the share of padded slots of each: as our trainer does (end to end in rows of at most the token
budget, `sessionrl.train.llm.data.packed`), one right-padded sequence per row grouped by the token budget
(first-fit decreasing), and fixed-size micro-batches in arrival order.

Last line: one JSON object with `ours_tok_per_s`, `trl_tok_per_s`, `ratio`, `unshared_tok_per_s`,
`ratio_unshared`, `tokens`, `computed_tokens`, `padding_rows`, `padding_fixed`, `threads` (ours packs rows end
to end, so it has no padding to report).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import torch

from sessionrl.envs import DecisionEnv, build
from sessionrl.envs.base import Split
from sessionrl.episodes import EpisodeSpec, RolloutConfig, expert, run_episodes
from sessionrl.episodes.llm import prompt_messages
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.session.model import Session
from sessionrl.store import SessionStore
from sessionrl.train.llm.data import (
    TokenSequence,
    Turn,
    demonstration_turns,
    fixed_batches,
    merge_turns,
    pack,
    packed,
    padding_fraction,
)
from sessionrl.train.llm.grpo import GRPOConfig, GRPOTrainer
from sessionrl.train.llm.run import split_digits, tokenizer_corpus
from sessionrl.train.llm.update import accumulate

ROLLOUT = RolloutConfig(full_schemas=False, domain_policy=False, max_tool_chars=300)


def expert_sessions(env: DecisionEnv, n: int) -> list[Session]:
    """`n` expert sessions of training tasks, through the orchestrator into an in-memory store."""
    store = SessionStore.open("sqlite://")
    specs = [EpisodeSpec(t, f"demo-{t.task_id}") for t in env.tasks(Split.TRAIN)[:n]]
    ran = asyncio.run(run_episodes(env, specs, expert(env), store, ROLLOUT))
    return [store.get(r.session_id) for r in ran]


def trl_trainer(model: Any, tokenizer: Any, prompts: list[str], batch: int, k: int, new_tokens: int) -> Any:
    """TRL's GRPOTrainer over `prompts` (already chat-formatted text) with a trivial reward."""
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    def reward(completions: list[str], **_: Any) -> list[float]:
        return [float(len(c) % 7) for c in completions]

    args = TRLConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=batch,
        num_generations=k,
        max_completion_length=new_tokens,
        temperature=1.0,
        beta=0.0,
        learning_rate=1e-3,
        report_to="none",
        logging_steps=1_000_000,
        save_strategy="no",
        seed=0,
    )
    data = Dataset.from_dict({"prompt": prompts})
    return TRLTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer
    )


def trl_batch(trainer: Any) -> dict[str, Any]:
    """One prepared TRL batch (completions sampled, rewards and advantages computed)."""
    trainer.model.train()
    raw = next(iter(trainer.get_train_dataloader()))
    return dict(trainer._prepare_inputs(raw))


def trl_update(trainer: Any, inputs: dict[str, Any]) -> float:
    """One TRL policy update on prepared inputs; returns its wall time in seconds."""
    model, optimizer = trainer.model, trainer.optimizer
    started = time.perf_counter()
    optimizer.zero_grad()
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return time.perf_counter() - started


def as_sequences(inputs: dict[str, Any]) -> list[TokenSequence]:
    """TRL's batch as our sequences: the same prompt and completion tokens, logprobs and advantages."""
    out = []
    old = inputs.get("old_per_token_logps")
    for row in range(inputs["prompt_ids"].shape[0]):
        prompt = inputs["prompt_ids"][row][inputs["prompt_mask"][row].bool()].tolist()
        keep = inputs["completion_mask"][row].bool()
        completion = inputs["completion_ids"][row][keep].tolist()
        logprobs = old[row][keep].tolist() if old is not None else [0.0] * len(completion)
        advantage = float(inputs["advantages"][row])
        out += merge_turns([Turn(tuple(prompt), tuple(completion), tuple(logprobs), advantage)])
    return out


def timed(update: Callable[[], object]) -> float:
    """Wall time of one call of `update`, in seconds."""
    started = time.perf_counter()
    update()
    return time.perf_counter() - started


def tokens_of(inputs: dict[str, Any]) -> int:
    """Real (unpadded) prompt and completion tokens of a TRL batch."""
    return int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sessions", type=int, default=64, help="expert sessions to draw prompts and lengths from"
    )
    parser.add_argument("--batch", type=int, default=16, help="completions per update")
    parser.add_argument("--k", type=int, default=4, help="completions per prompt (group size)")
    parser.add_argument("--new-tokens", type=int, default=32, help="longest completion")
    parser.add_argument("--repeats", type=int, default=5, help="timed updates per trainer (median reported)")
    parser.add_argument(
        "--budget", type=int, default=16384, help="token budget of a micro-batch (TRL takes the batch whole)"
    )
    parser.add_argument("--fixed", type=int, default=8, help="sequences per fixed-size micro-batch")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one on crowded cores)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    warnings.filterwarnings("ignore")

    env = build("orders", train=max(args.sessions, 8))
    sessions = expert_sessions(env, args.sessions)
    system = prompt_messages(env, env.tasks(Split.TRAIN)[0], ROLLOUT)[0].content
    folder = Path(tempfile.mkdtemp(prefix="bench-trainer-"))
    model, tokenizer = build_tiny_policy(
        tokenizer_corpus(env, system, sessions, 300), TinyModelConfig(), folder
    )
    split_digits(tokenizer)
    policy = HFPolicy(model, tokenizer, SamplingConfig(max_new_tokens=args.new_tokens))

    # padding: real session lengths, token budget vs fixed count
    demos = [
        s for session in sessions for s in merge_turns(demonstration_turns(session, system, policy, 300))
    ]
    lengths = [len(s) for s in demos]
    padding_rows = padding_fraction(lengths, pack(lengths, args.budget))
    padding_fixed = padding_fraction(lengths, fixed_batches(len(lengths), args.fixed))

    # the same batch for both trainers: prompts of real sessions, completions sampled by TRL
    prompt_texts = []
    for session in sessions[: args.batch // args.k]:
        turns = demonstration_turns(session, system, policy, 300)
        prompt_texts.append(tokenizer.decode(list(turns[-1].prompt)))
    trl = trl_trainer(model, tokenizer, prompt_texts, args.batch, args.k, args.new_tokens)
    trl.create_optimizer_and_scheduler(num_training_steps=args.repeats + 1)
    trl.current_gradient_accumulation_steps = 1  # what `Trainer.train` sets before each step
    inputs = trl_batch(trl)
    sequences = as_sequences(inputs)
    tokens = tokens_of(inputs)
    assert tokens == sum(len(s) for s in sequences)

    config = GRPOConfig(lr=1e-3, token_budget=args.budget)
    ours = GRPOTrainer(model, config, tokenizer.pad_token_id)
    computed = packed(sequences, args.budget).computed

    def unshared() -> None:  # the same update, every sequence computed whole
        batch = packed(sequences, args.budget, share_prefixes=False)
        accumulate(model, ours.optimizer, batch, ours.loss, config.max_grad_norm)

    ours.step(sequences)  # warm-up
    unshared()
    trl_update(trl, inputs)
    times: dict[str, list[float]] = {"ours": [], "unshared": [], "trl": []}
    for _ in range(args.repeats):  # interleaved, so all meet the same machine load
        times["ours"].append(timed(lambda: ours.step(sequences)))
        times["unshared"].append(timed(unshared))
        times["trl"].append(trl_update(trl, inputs))

    ours_rate, unshared_rate, trl_rate = (tokens / statistics.median(times[k]) for k in times)
    print(f"batch: {len(sequences)} sequences, {tokens} tokens; demo lengths {min(lengths)}..{max(lengths)}")
    print(f"ours computes {computed} tokens (each shared prefix once), TRL {tokens}")
    print(
        f"ours: {ours_rate:,.0f} tok/s ({ours_rate / trl_rate:.2f}x)   unshared: {unshared_rate:,.0f} tok/s "
        f"({unshared_rate / trl_rate:.2f}x)   TRL GRPOTrainer: {trl_rate:,.0f} tok/s"
    )
    print(
        f"padding: ours none (rows packed end to end), one sequence per row by token budget "
        f"{padding_rows:.3f}, fixed {args.fixed} per batch {padding_fixed:.3f}"
    )
    summary = {
        "ours_tok_per_s": round(ours_rate, 1),
        "trl_tok_per_s": round(trl_rate, 1),
        "ratio": round(ours_rate / trl_rate, 3),
        "unshared_tok_per_s": round(unshared_rate, 1),
        "ratio_unshared": round(unshared_rate / trl_rate, 3),
        "padding_rows": round(padding_rows, 4),
        "padding_fixed": round(padding_fixed, 4),
        "tokens": tokens,
        "computed_tokens": computed,
        "threads": torch.get_num_threads(),
    }
    print(orjson.dumps(summary).decode())


if __name__ == "__main__":
    main()
