"""Rejection-sampling fine-tuning (`trainer: rft`): imitation, then rounds of sample, judge, imitate.

    sft     expert episodes ──▶ SFT steps ──▶ sft_policy/          (the `sft:` section, as every trainer)
    round   `rft.tasks` training tasks, drawn anew ──▶ `rft.samples` episodes each with the current policy
            ──▶ the judge keeps some ──▶ `rft.trainer.steps` SFT steps on the kept episodes' own tokens
    export  rft_policy/, then sft_policy/ and rft_policy/ evaluated on the report split

The judge (`rft.accept`):

- `task`: the environment's verdict: an episode is kept when it solved its task;
- `dense`: the reward engine's per-step terms: an episode is kept when it ended with an answer, made at
  least one tool call, and no term charged any of its steps (no failed call of its own doing, no reply
  that was not an action, ...). It keeps partial successes the task verdict throws away.
- `clean`: both: the task solved, and no step charged. A solved episode sampled at a temperature can
  still hold a reply that was no action or a call the policy got wrong; `task` imitates those too.

The K episodes of a task share their environment seed, so they meet the same faults. The kept episodes
train through the imitation trainer (`SFTTrainer`, the one SFT implementation) on the tokens the policy
sampled (the turns' recorded ids: nothing is tokenised again). Every round counts what it sampled, kept
and rejected, by reason, how many kept episodes are distinct, and how surprising their tokens were to the
policy that drew them; it prints that and logs it (the `rft` record of metrics.jsonl). A nearly
deterministic policy draws one episode K times, and its kept tokens carry almost no surprise: such a round
has little to teach (docs/training.md, "The demo's recipe"). A round that keeps fewer than `rft.min_kept`
distinct episodes trains on none and says so: a handful of episodes imitated for many steps is learned by
rote (measured on SmolLM2: one episode kept of 16, 12 steps, took the parse rate of its replies from 0.97
to 0.38 and tool accuracy from 0.25 to 0.13), and K copies of one episode are one episode.

With `rft.dev_tasks: N`, N dev tasks judge the rounds: the policy is evaluated greedily on them before the
first round, and again after each round that trained; a round after which it solves fewer of them than the
weights it started from is undone, and the next round starts from those weights again. Each verdict is
printed and logged (the `rft_dev` record; the evaluations are `eval` records labelled `rft-dev-<round>`,
0 for the weights the rounds start from). `sessionrl.train.llm.evaluation.DevValidation` does it, and
judges GRPO's iterations the same way with `rl.dev_tasks`. On the tiny model a round moves success by a
few tasks either way (docs/training.md, "The demo's recipe"): validation keeps a round that does harm on
dev from reaching the report.

With `rft.replay: r`, a share r of each batch of a round's imitation is drawn from the demonstrations
imitation learned from (a run resumed after imitation reads them back from its store), the rest from the
kept episodes. The kept episodes are the policy's own, from the states it reaches; imitating only them, the
tiny model's tool accuracy on the expert's turns fell at every seed of the learning bench, by naming the
wrong tool or writing no action where the expert's episodes go (docs/training.md). Fewer demonstrations
than `rft.min_kept` stop the run before it trains: replayed in every batch, they would be learned by rote.

To start from an exported policy (a separate imitation run), point `model.path` at its folder and set
`sft.trainer.steps: 0`. A `trainer: grpo` run with an `rft:` section runs the same rounds after its gate
and before GRPO (`warm_start`), so GRPO starts from the policy they made.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console

from sessionrl.envs.base import Split, Task, stream_seed
from sessionrl.episodes import EpisodeSpec, Ran
from sessionrl.rewards.vector import RewardVector
from sessionrl.session.model import Session
from sessionrl.train.config import RFTSection, RunConfig
from sessionrl.train.llm.checkpoint import Stage, save_checkpoint
from sessionrl.train.llm.data import TokenSequence, merge_turns, policy_turns
from sessionrl.train.llm.evaluation import SEED_BITS, DevValidation, evaluate_exported, in_lockstep
from sessionrl.train.llm.imitation import demonstration_sequences, demonstration_sessions, imitation
from sessionrl.train.llm.loop import TrainResult, start_run
from sessionrl.train.llm.run import Run, export_policy
from sessionrl.train.llm.sft import SFTTrainer


def round_specs(run: Run, section: RFTSection, round_: int) -> list[EpisodeSpec]:
    """K episodes for each of the round's training tasks (drawn by a generator named by the round); the
    K of a task share its environment seed."""
    cfg = run.config
    tasks: Sequence[Task] = run.env.tasks(Split.TRAIN)
    rng = random.Random(stream_seed(cfg.seed, "rft", round_, bits=SEED_BITS))
    chosen = rng.sample(list(tasks), min(section.tasks, len(tasks)))
    faults = cfg.faults.at(round_)
    return [
        EpisodeSpec(
            task=task,
            session_id=f"rft-{round_:02d}-{task.task_id}-{k}",
            seed=stream_seed(cfg.seed, "rft", round_, task.task_id, bits=SEED_BITS),
            faults=faults,
            metadata={"stage": "rft", "round": round_},
        )
        for task in chosen
        for k in range(section.samples)
    ]


def dense_verdict(session: Session, vector: RewardVector) -> str | None:
    """Why the dense judge rejects `session` (None: it accepts it): no answer, no tool call, or the first
    term (by name) that charged one of its steps."""
    if session.final_output is None:
        return "no answer"
    if not session.tool_calls:
        return "no tool call"
    charged = sorted({t.name for t in vector.terms if any(v < 0 for v in t.steps.values())})
    return f"charged by {charged[0]}" if charged else None


@dataclass(frozen=True, slots=True)
class Judged:
    """One round's episodes after the judge: those kept, and the rejected ones counted by reason."""

    kept: tuple[Session, ...]
    rejected: dict[str, int]

    @property
    def distinct(self) -> int:
        """Kept episodes that differ in what the policy sampled: K copies of one episode teach it once."""
        return len({tuple(t.completion for t in policy_turns(s, {})) for s in self.kept})

    @property
    def nats(self) -> float | None:
        """Mean surprise of the kept episodes' sampled tokens (minus their recorded logprobs), in nats: the
        loss the round's first step starts from. Near 0, the kept episodes are what the policy would draw
        anyway, and its steps have little to teach (None: nothing kept, or no logprobs recorded)."""
        logprobs = [lp for s in self.kept for t in policy_turns(s, {}) for lp in t.logprobs or ()]
        return -sum(logprobs) / len(logprobs) if logprobs else None

    def as_record(self) -> dict[str, int | float]:
        """`sampled`, `kept`, `distinct`, `kept_nats` (when known), and `rejected_<reason>` for each reason
        (spaces as underscores)."""
        reasons = {f"rejected_{r.replace(' ', '_')}": n for r, n in sorted(self.rejected.items())}
        sampled = len(self.kept) + sum(self.rejected.values())
        nats = {} if self.nats is None else {"kept_nats": round(self.nats, 6)}
        return {"sampled": sampled, "kept": len(self.kept), "distinct": self.distinct, **nats, **reasons}


def judge(run: Run, accept: str, ran: Sequence[Ran]) -> Judged:
    """The episodes `ran` judged as `accept` says (see the module doc)."""
    kept: list[Session] = []
    rejected: Counter[str] = Counter()
    for r in ran:
        session = run.store.get(r.session_id)
        why = None if r.success or accept == "dense" else "task not solved"
        if why is None and accept != "task":
            why = dense_verdict(session, run.shaper.engine.score(session, learn=False))
        if why is None and not policy_turns(session, {}):
            why = "no sampled tokens"  # a session this policy did not sample: nothing to imitate
        if why is None:
            kept.append(session)
        else:
            rejected[why] += 1
    return Judged(tuple(kept), dict(rejected))


def kept_sequences(sessions: Sequence[Session]) -> list[TokenSequence]:
    """The kept episodes as training sequences: the policy's own sampled turns, every reply trained."""
    return [seq for s in sessions for seq in merge_turns(policy_turns(s, {}), s.session_id)]


def imitate(
    run: Run,
    section: RFTSection,
    sequences: Sequence[TokenSequence],
    round_: int,
    demonstrations: Sequence[TokenSequence] = (),
) -> None:
    """`rft.trainer.steps` SFT steps on `sequences` (a fresh optimiser and schedule each round), each on a
    batch drawn by a generator named by the round and the step; with `rft.replay`, that share of each
    batch is drawn from `demonstrations` instead."""
    cfg, policy = run.config, run.need_policy()
    size = section.trainer.batch_sessions
    replayed = min(round(size * section.replay), len(demonstrations))
    trainer = SFTTrainer(policy.model, section.trainer, policy.tokenizer.pad_token_id)
    policy.release()  # the round's caches: no episode goes on with these weights
    for step in range(section.trainer.steps):
        rng = random.Random(stream_seed(cfg.seed, "rft-batch", round_, step, bits=SEED_BITS))
        batch = rng.sample(list(sequences), min(size - replayed, len(sequences)))
        batch += rng.sample(list(demonstrations), replayed)
        stats = trainer.step(batch)
        done = round_ * section.trainer.steps + step  # steps of all rounds, in order
        record = {"round": round_, "loss": stats.loss, "tokens": stats.tokens, "replayed": replayed}
        run.log.write("rft_update", done, record)
    policy.version += 1  # the engine serves the updated weights from now on


def replay_data(
    run: Run, section: RFTSection, console: Console, demos: Sequence[Session] | None
) -> list[TokenSequence]:
    """The demonstrations imitation learned from (`demos`; None: read back, as a resumed run does), as the
    policy's sequences, when `rft.replay` asks for them (none otherwise). Fewer than `rft.min_kept` of
    them stop the run: replayed in every batch, a handful would be learned by rote, as a round's few kept
    episodes would."""
    if not section.replay:
        return []
    demos = demonstration_sessions(run, console) if demos is None else demos
    if len(demos) < section.min_kept:
        raise ValueError(
            f"rft.replay draws from {len(demos)} demonstrations, under rft.min_kept={section.min_kept}:"
            " replayed in every batch, they would be learned by rote. A stage that starts from an exported"
            " policy records them again: give it the `sft.demos` imitation had"
        )
    sequences = demonstration_sequences(run, console, run.need_policy(), demos)
    if not sequences:
        raise ValueError("rft.replay needs demonstrations to replay, and imitation had none")
    console.print(
        f"rft replays {len(sequences)} demonstration sequences, {section.replay:.0%} of each batch",
        markup=False,
        highlight=False,
    )
    return sequences


def rejection_rounds(
    run: Run, section: RFTSection, console: Console, demos: Sequence[Session] | None
) -> list[Judged]:
    """Every round: sample with the current policy, judge, imitate what was kept (with `rft.replay`, beside
    `demos`, imitation's demonstrations), and, with `rft.dev_tasks`, keep or undo the round by its dev
    tasks; each round's counts are printed and logged."""
    policy, rounds = run.need_policy(), []
    demonstrations = replay_data(run, section, console, demos)  # first: too few stop the run at once
    validation = (
        DevValidation.start(run, "rft", section.dev_tasks, tools=section.dev_tool_accuracy)
        if section.dev_tasks
        else None
    )
    for round_ in range(section.rounds):
        # sample
        ran = in_lockstep(run, round_specs(run, section, round_), policy.view(section.sampling))
        # judge
        judged = judge(run, section.accept, ran)
        record = judged.as_record()
        run.log.write("rft", round_, {"round": round_, "accept": section.accept, **record})
        console.print(
            f"rft round {round_ + 1}/{section.rounds}: kept {record['kept']} of {record['sampled']}"
            f" episodes ({section.accept} judge), {record['distinct']} distinct"
            + (f", {record['kept_nats']:.3g} nats a sampled token" if "kept_nats" in record else "")
            + f"; rejected: {judged.rejected or 'none'}",
            markup=False,
            highlight=False,
        )
        rounds.append(judged)
        # imitate
        if record["distinct"] < section.min_kept:
            console.print(
                f"rft round {round_ + 1}: {record['distinct']} distinct episodes kept (of {record['kept']}),"
                f" under rft.min_kept={section.min_kept}, so nothing trained (sample more tasks, at a"
                " higher temperature, or lower the bar)",
                markup=False,
                highlight=False,
            )
            continue
        imitate(run, section, kept_sequences(judged.kept), round_, demonstrations)
        if validation is not None:
            validation.judge(run, round_, console)
    return rounds


def warm_start(run: Run, console: Console, demos: Sequence[Session] | None) -> None:
    """GRPO's warm start (`trainer: grpo` with an `rft:` section), after the gate: the rejection-sampling
    rounds (`demos` as for `rejection_rounds`), `rft_policy/` exported, and a checkpoint at the start of RL
    with the weights they made. A run interrupted during the rounds resumes them from the imitation
    policy."""
    section = run.config.rft
    if section is None:
        raise ValueError("warm_start needs the run's `rft:` section")
    rejection_rounds(run, section, console, demos)
    policy = run.need_policy()
    export_policy(policy, run.folder / "rft_policy")
    run.state = dataclasses.replace(run.state, stage=Stage.RL, step=0, policy_version=policy.version)
    save_checkpoint(run.folder / "checkpoint", policy.model, None, run.state, run.generators)


def train_rft(config: RunConfig, *, console: Console | None = None) -> TrainResult:
    """`trainer: rft`: imitation, the rejection-sampling rounds, then `sft_policy/` and `rft_policy/`
    evaluated on the report split."""
    console = console or Console()
    section = config.rft
    if section is None:
        raise ValueError("trainer rft needs an `rft:` section (`rft: {}` for defaults)")
    with start_run(config, resume=False) as run:
        demos = imitation(run, console, resume=False)
        rejection_rounds(run, section, console, demos)
        policy = run.need_policy()
        run.state = dataclasses.replace(run.state, stage=Stage.RFT, policy_version=policy.version)
        export_policy(policy, run.folder / "rft_policy")
        report = evaluate_exported(run, config.evaluation.split, config.evaluation.tasks)
        return TrainResult(run.state.stage, None, (), report)


__all__ = [
    "Judged",
    "dense_verdict",
    "judge",
    "kept_sequences",
    "rejection_rounds",
    "replay_data",
    "round_specs",
    "train_rft",
    "warm_start",
]
