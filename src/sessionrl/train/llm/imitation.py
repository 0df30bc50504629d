"""Stage 1, imitation: the demonstrations (the expert's solved episodes on training tasks, recorded once, or
the captured sessions `sft.store` selects) as training sequences, and the SFT steps on them.

    expert episodes on training tasks ──▶ store ──▶ demonstrations ──▶ SFT steps ──▶ sft_policy/

`imitation` is the stage; the later stages (`sessionrl.train.llm.loop`, `.rft`, `.preferences`,
`.reflection`) start from the policy it builds and read its demonstrations back the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Sequence

from rich.console import Console

from sessionrl.envs.base import Split, stream_seed
from sessionrl.envs.splits import TRAIN_SPLIT_NEEDED, tasks_of
from sessionrl.episodes import Tally, expert, progress, require, run_episodes
from sessionrl.policy.llm import HFPolicy
from sessionrl.session.model import Session
from sessionrl.train.llm.captured import captured_sequences, stored_sessions
from sessionrl.train.llm.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from sessionrl.train.llm.data import TokenSequence, demonstration_turns, merge_turns
from sessionrl.train.llm.distributed import lead, step_everywhere
from sessionrl.train.llm.evaluation import SEED_BITS, once_per_task
from sessionrl.train.llm.run import Run, build_policy, export_policy, tokenizer_corpus
from sessionrl.train.llm.sft import SFTTrainer


def record_demonstrations(run: Run, console: Console | None = None) -> list[Session]:
    """Expert episodes on the first `sft.demos` training tasks (recorded once); the solved ones.

    Every requested demonstration that is missing is counted by its reason (`Tally`), printed and logged
    (the `demos` record of metrics.jsonl); more than `MAX_MISSING` of them missing stops the run with
    `MissingDemonstrations`.
    """
    cfg, console = run.config, console or Console()
    faults = cfg.faults.fixed(cfg.faults.demo_rate)
    if cfg.sft.demos:
        tasks_of(run.env, Split.TRAIN, TRAIN_SPLIT_NEEDED)  # none: say which splits it has, how to add
    tasks = run.env.tasks(Split.TRAIN)[: cfg.sft.demos]
    specs = once_per_task(cfg.seed, tasks, "demo", "demo", faults, {"stage": "demo"})
    with progress(console, "demonstrations", len(specs)) as bar:
        batch = run_episodes(
            run.env,
            specs,
            expert(run.env),
            run.store,
            cfg.rollout,
            orchestrator=cfg.orchestrator,
            done=lambda _: bar.advance(),
        )
        ran = asyncio.run(batch)
    tally = Tally.of(cfg.sft.demos, ran)
    run.log.write("demos", 0, tally.as_record())
    console.print(tally.describe(), markup=False, highlight=False)
    require(tally)
    return [run.store.get(r.session_id) for r in ran if r.success]


def demonstrations(run: Run, policy: HFPolicy, demos: Sequence[Session]) -> list[TokenSequence]:
    """The demonstration sessions as training sequences."""
    max_chars = run.config.rollout.max_tool_chars
    return [
        seq
        for s in demos
        for seq in merge_turns(
            demonstration_turns(s, run.system, policy, max_chars, policy.tool_format), s.session_id
        )
    ]


def captured(
    run: Run, console: Console, policy: HFPolicy, sessions: Sequence[Session]
) -> list[TokenSequence]:
    """Captured sessions as training sequences, after the integrity check; each dropped one is printed
    and logged with its reason."""
    data = captured_sequences(sessions, policy)
    for session_id, reason in data.dropped:
        console.print(f"dropped captured session {session_id}: {reason}")
    run.log.write("captured", run.state.step, {"kept": len(data.kept), "dropped": len(data.dropped)})
    if not data.sequences:
        raise ValueError(f"none of the {len(sessions)} captured sessions can be trained on")
    return data.sequences


def demonstration_sessions(run: Run, console: Console) -> list[Session]:
    """What imitation learns from: the expert's solved episodes (recorded once), or the sessions `sft.store`
    selects."""
    source = run.config.sft.store
    if source is None:
        return record_demonstrations(run, console)
    return stored_sessions(source.db, source.filters, source.limit)


def demonstration_sequences(
    run: Run, console: Console, policy: HFPolicy, demos: Sequence[Session]
) -> list[TokenSequence]:
    """`demonstration_sessions`' sessions as `policy`'s training sequences."""
    if run.config.sft.store is None:
        return demonstrations(run, policy, demos)
    return captured(run, console, policy, demos)


def imitation(run: Run, console: Console, resume: bool) -> list[Session]:
    """The SFT stage: record demonstrations, build the policy, take `sft.trainer.steps` steps, export;
    returns the demonstrations."""
    cfg = run.config
    demos = demonstration_sessions(run, console)
    texts = tokenizer_corpus(run.env, run.system, demos, cfg.rollout.max_tool_chars)
    run.policy = policy = build_policy(cfg, texts, run.folder / "base")
    trainer = SFTTrainer(policy.model, cfg.sft.trainer, policy.tokenizer.pad_token_id)
    resumed = resume and has_checkpoint(run.folder / "checkpoint")
    if resumed:
        run.state = load_checkpoint(
            run.folder / "checkpoint", policy.model, trainer.optimizer, run.generators
        )
        trainer.steps = run.state.step
    lead(trainer, resumed=resumed)  # under torchrun, the other ranks build theirs and take its weights
    sequences = demonstration_sequences(run, console, policy, demos)
    run.log.write("sft", run.state.step, {"demos": len(demos), "sequences": len(sequences)})
    steps = cfg.sft.trainer.steps
    with progress(console, "imitation", steps, completed=run.state.step) as bar:
        for step in range(run.state.step, steps):
            # batch: a generator named by the step, so a resumed run draws the same batches
            rng = random.Random(stream_seed(cfg.seed, "sft", step, bits=SEED_BITS))
            batch = rng.sample(sequences, min(cfg.sft.trainer.batch_sessions, len(sequences)))
            # update
            stats = step_everywhere(trainer, batch)
            # log
            run.log.write("sft", step, stats.as_record())
            bar.advance(info=f"loss {stats.loss:.3f}")
            run.state = dataclasses.replace(run.state, step=step + 1)
            if (step + 1) % 25 == 0:
                save_checkpoint(
                    run.folder / "checkpoint", policy.model, trainer.optimizer, run.state, run.generators
                )
    export_policy(policy, run.folder / "sft_policy")
    return demos


__all__ = [
    "captured",
    "demonstration_sequences",
    "demonstration_sessions",
    "demonstrations",
    "imitation",
    "record_demonstrations",
]
