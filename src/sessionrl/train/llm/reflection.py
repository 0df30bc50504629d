"""The third training stage, reflection, and the staged run `stages: [imitation, rl, reflection]`.

    try       the RL policy attempts `reflection.tasks` training tasks (past the demonstrated ones, when the
              split has them: the imitated tasks are the ones it fails least, and least like held-out ones)
    reflect   each failure gets a reflection record from the judge's offline extractor (stored as feedback)
    correct   the expert replays each failed episode (its task, seed and faults) with the reflection in
              its request: corrected retries. The same seed and faults make a tool fault the attempt
              ignored hit the expert's call of that tool too, so the retry shows the error met and the call
              made again, which is what such a reflection says (paired with a retry that never meets what
              it describes, a reflection teaches the policy nothing to read in it)
    train     SFT on the corrected retries and the imitation demonstrations, half a batch each (the
              retries are few beside the demonstrations; drawn uniformly from both, a batch would seldom
              hold one, and the policy would never learn to read a reflection), plus a root-cause
              prediction loss on half a batch more: after a failed transcript and `ROOT_CAUSE_QUESTION`,
              the answer `root cause: <cause>`, weighted from `root_cause_weight[0]` to `[1]` (the L5 weight,
              0.1 → 0.2) over the stage's steps ──▶ reflection_policy/
    measure   correction uplift on held-out failures: the RL policy's failures on the report split, each
              retried once by the RL policy without a reflection and once by the reflection policy with
              it, on the same seeds (so the same faults); CU is the difference of their success rates.
              Two controls: the RL policy retrying with the reflection (what the reflection does
              untrained), and the reflection policy retrying without one (what the training does
              without the reflection; `Uplift.read` is what reading it adds to the trained policy)

The reflection a held-out retry reads is the judge's (`reflection.reflector: judge`), or the reflection
policy's own (`policy`): asked `ROOT_CAUSE_QUESTION` after the failed transcript, it names a cause, and the
cause's generic plan goes with it (`cause_reflection`); the corrected retries it trains on then carry the
judge's cause in that same form, so training and measurement read one kind of reflection.

`train_stages` runs imitation and RL (the grpo loop), then this stage, and reports after each stage the
five dimensions (TCSR, DVR, ER@5, CU, SPT) and the capability levels on the report split.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from torch import Tensor

from sessionrl.envs.base import Split, Task, error_kinds, stream_seed
from sessionrl.envs.faults import Faults
from sessionrl.episodes import EpisodeSpec, expert, progress, run_episodes
from sessionrl.episodes.llm import PolicyAgent
from sessionrl.episodes.verdict import task_success
from sessionrl.eval.curriculum import expert_steps
from sessionrl.eval.levels import LevelReport, assess
from sessionrl.eval.metrics import AgentMetrics, success_rate
from sessionrl.eval.significance import PairedComparison, paired_comparison
from sessionrl.policy.llm import HFPolicy, with_lora
from sessionrl.reflection import (
    ANNOTATOR,
    ROOT_CAUSE_QUESTION,
    Reflection,
    RootCause,
    cause_reflection,
    parse_root_cause,
    reflect,
    root_cause_answer,
    with_reflection,
)
from sessionrl.session import FeedbackAdded, Message, Session
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.checkpoint import Stage, stamp, weights
from sessionrl.train.llm.data import (
    ChatEncoder,
    MicroBatch,
    TokenSequence,
    Turn,
    demonstration_replies,
    merge_turns,
)
from sessionrl.train.llm.evaluation import SEED_BITS, evaluate, once_per_task
from sessionrl.train.llm.imitation import demonstrations
from sessionrl.train.llm.loop import TrainResult, train
from sessionrl.train.llm.run import Run, evaluation_view, export_policy, open_run
from sessionrl.train.llm.sft import SFTTrainer
from sessionrl.train.llm.update import token_logprobs

# episodes


def attempt(
    run: Run,
    policy: HFPolicy,
    tasks: Sequence[Task],
    label: str,
    stream: str,
    extra: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Session]:
    """One greedy episode of `policy` per task (`attempt_faults`, seeded by `stream` and the task), in
    sessions `<label>-<task id>`; `extra` adds metadata by task id."""
    cfg = run.config
    view = evaluation_view(policy, cfg.evaluation.max_new_tokens, cfg.evaluation.temperature)
    faults = attempt_faults(cfg)
    specs = once_per_task(cfg.seed, tasks, stream, label, faults, {"stage": "reflection", "label": label})
    extra = extra or {}
    specs = [dataclasses.replace(s, metadata={**s.metadata, **extra.get(s.task.task_id, {})}) for s in specs]
    batch = run_episodes(run.env, specs, PolicyAgent(view, policy.version), run.store, cfg.rollout)
    ran = asyncio.run(batch)
    policy.release()  # what the engine kept for these episodes: none of them goes on
    return [run.store.get(r.session_id) for r in ran]


def attempt_faults(config: RunConfig) -> Faults:
    """The faults a policy's attempt meets in this stage: the evaluation rate."""
    return config.faults.fixed(config.faults.eval_rate)


def reflect_on(run: Run, sessions: Sequence[Session]) -> list[tuple[Session, Reflection]]:
    """Each failed session with the judge's reflection on it, which is also stored as its feedback."""
    tasks = {t.task_id: t for split in Split for t in run.env.tasks(split)}
    out = []
    for session in sessions:
        task = tasks[str(session.metadata["task_id"])]
        reflection = reflect(session, run.env.expert(task), error_kinds(run.env))
        if reflection is not None:
            kept(run, session, reflection)
            out.append((session, reflection))
    return out


def kept(run: Run, session: Session, reflection: Reflection) -> None:
    """Store `reflection` as the session's feedback, unless one from the same source is there already
    (a resumed run reflects on the episodes it reads back)."""
    for feedback in session.feedback:
        if feedback.annotator == ANNOTATOR and feedback.data["reflection"]["source"] == reflection.source:
            return
    run.store.append(session.session_id, FeedbackAdded(feedback=reflection.as_feedback()))


def self_reflect(run: Run, policy: HFPolicy, failed: Sequence[Session]) -> dict[str, Reflection]:
    """The policy's own reflections on `failed`, by session id: asked `ROOT_CAUSE_QUESTION` after each
    transcript (greedily), the cause its answer names, with that cause's generic plan (`cause_reflection`),
    stored as feedback. An answer that names no cause of the taxonomy gives no reflection; how many did
    is logged (`self_reflection` record)."""
    max_chars = run.config.rollout.max_tool_chars
    greedy = evaluation_view(policy, 24)
    question = Message(role="user", content=ROOT_CAUSE_QUESTION)
    prompts = [greedy.encode_prompt([*transcript(s, run.system, max_chars), question]) for s in failed]
    answers = greedy.sample_prompts(prompts) if prompts else []
    out = {}
    for session, answer in zip(failed, answers, strict=True):
        cause = parse_root_cause(answer.text)
        if cause is not None:
            out[session.session_id] = cause_reflection(session.session_id, cause)
            kept(run, session, out[session.session_id])
    run.log.write("self_reflection", 0, {"failed": len(failed), "named_a_cause": len(out)})
    return out


def corrected_retries(run: Run, failed: Sequence[tuple[Session, Reflection]]) -> list[Session]:
    """The expert's replays of the failed episodes (same seed, same faults as `attempt` met) with their
    reflections in the request; the solved ones.

    They are demonstrations (`metadata.corrects` names the failed session), not the policy's retries, so
    they carry no `retry_of` and never count towards L5."""
    tasks = {t.task_id: t for t in run.env.tasks(Split.TRAIN)}
    faults = attempt_faults(run.config)
    specs = [
        EpisodeSpec(
            with_reflection(tasks[str(s.metadata["task_id"])], r),
            session_id=f"corrected-{stamp(r.as_text(), repr(faults))}-{s.session_id}",
            seed=int(s.metadata["seed"]),
            faults=faults,
            metadata={"stage": "reflection-demo", "corrects": s.session_id},
        )
        for s, r in failed
    ]
    batch = run_episodes(run.env, specs, expert(run.env), run.store, run.config.rollout)
    return [run.store.get(r.session_id) for r in asyncio.run(batch) if r.success]


# data


def transcript(session: Session, system: str, max_tool_chars: int) -> list[Message]:
    """A session as the conversation the policy saw: system, request, each action and tool answer, and
    the final answer when there was one."""
    replies = demonstration_replies(session, system, max_tool_chars)
    if not replies:
        return [Message(role="system", content=system), Message(role="user", content=session.user_query)]
    return [*replies[-1].messages, Message(role="assistant", content=replies[-1].text)]


def root_cause_turn(
    session: Session, cause: RootCause, system: str, encoder: ChatEncoder, max_tool_chars: int
) -> Turn:
    """The failed session's transcript, `ROOT_CAUSE_QUESTION`, then the answer naming `cause`."""
    messages = transcript(session, system, max_tool_chars)
    messages.append(Message(role="user", content=ROOT_CAUSE_QUESTION))
    answer = encoder.encode_reply(root_cause_answer(cause))
    return Turn(tuple(encoder.encode_prompt(messages)), tuple(answer))


def root_cause_sequences(
    run: Run, policy: HFPolicy, failed: Sequence[tuple[Session, Reflection]]
) -> list[TokenSequence]:
    """A root-cause turn (`root_cause_turn`) for each failure, as training sequences."""
    max_chars = run.config.rollout.max_tool_chars
    return [
        seq
        for session, reflection in failed
        for seq in merge_turns(
            [root_cause_turn(session, reflection.root_cause, run.system, policy, max_chars)],
            session.session_id,
        )
    ]


def weighted(sequences: Sequence[TokenSequence], weight: float) -> list[TokenSequence]:
    """`sequences` with `weight` on every trained token (in `advantages`, which `ReflectionTrainer` reads
    as per-token loss weights: negative marks the root-cause head's tokens)."""
    return [
        dataclasses.replace(s, advantages=tuple(weight if m else 0.0 for m in s.loss_mask)) for s in sequences
    ]


def root_cause_weight(step: int, steps: int, span: tuple[float, float]) -> float:
    """The root-cause loss weight at `step` of `steps`: linear from `span[0]` to `span[1]`.

    >>> [round(root_cause_weight(s, 3, (0.1, 0.2)), 3) for s in range(3)]
    [0.1, 0.15, 0.2]
    """
    start, end = span
    return start if steps <= 1 else start + (end - start) * step / (steps - 1)


class ReflectionTrainer(SFTTrainer):
    """SFT whose tokens carry weights: `advantages` > 0 for corrected retries and demonstrations,
    < 0 (its absolute value the weight) for root-cause answers; the loss is the weighted mean NLL."""

    def loss(self, micro: MicroBatch) -> tuple[Tensor, dict[str, float]]:
        """Weighted NLL over policy tokens, with the NLL of each part reported apart."""
        nll = -token_logprobs(self.model, micro)
        mask = micro.loss_mask
        weight = micro.advantages.abs() * mask
        loss = (nll * weight).sum() / mask.sum().clamp_min(1)
        seen = nll.detach()
        cause = mask & (micro.advantages < 0)
        retry = mask & (micro.advantages > 0)
        parts = {
            "retry_nll": float((seen * retry).sum() / retry.sum().clamp_min(1)),
            "root_cause_nll": float((seen * cause).sum() / cause.sum().clamp_min(1)),
        }
        return loss, parts


# the stage


@dataclass(frozen=True, slots=True)
class Uplift:
    """Correction uplift on held-out failures (see the module doc)."""

    failures: int
    without: tuple[Session, ...]
    with_reflection: tuple[Session, ...]
    untrained_with_reflection: tuple[Session, ...]
    """The RL policy's retries with the reflection: what the reflection alone does, untrained."""
    trained_without_reflection: tuple[Session, ...] = ()
    """The reflection policy's retries without a reflection: what the stage's training alone does, so
    that `read` tells reading the reflection apart from being trained."""

    @property
    def cu(self) -> float | None:
        """Success with reflection (stage 3) minus success without (stage 2); None without failures."""
        if not self.failures:
            return None
        return success_rate(self.with_reflection) - success_rate(self.without)

    causes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """How many of the failures the judge put down to each root cause."""

    def comparison(self, against: Sequence[Session] | None = None) -> PairedComparison:
        """The retries with the reflection (stage 3) against `against` (by default the plain retries of
        stage 2), paired by task: McNemar's exact p and the bootstrap interval of the change."""
        return paired_comparison(
            success_by_task(self.without if against is None else against),
            success_by_task(self.with_reflection),
        )

    @property
    def p_value(self) -> float:
        """McNemar's p of the paired retries."""
        return self.comparison().p_value

    def read(self) -> PairedComparison | None:
        """What reading the reflection adds to the reflection policy: its retries with the reflection
        against its retries without; None when the latter were not played."""
        if not self.trained_without_reflection:
            return None
        return self.comparison(self.trained_without_reflection)


def success_by_task(sessions: Sequence[Session]) -> dict[str, bool]:
    """Whether each session's task was solved, by task id (what `paired_comparison` pairs)."""
    return {str(s.metadata["task_id"]): task_success(s) is True for s in sessions}


def reflection_stage(run: Run, console: Console) -> dict[str, Any]:
    """Try, reflect, correct and train (see the module doc); exports `reflection_policy/` and returns what
    the stage used and its last losses."""
    cfg, rc, policy = run.config, run.config.reflection, run.need_policy()
    tried = attempt(run, policy, practice_tasks(run), "s3-try", "s3-try")
    failed = reflect_on(run, tried)
    retries = corrected_retries(run, failed if rc.reflector == "judge" else as_the_policy_writes(failed))
    demos = [s for s in run.store.iter_sessions() if s.metadata.get("stage") == "demo" and task_success(s)]
    corrected = weighted(demonstrations(run, policy, retries), 1.0)
    imitated = weighted(demonstrations(run, policy, demos), 1.0)
    causes = root_cause_sequences(run, policy, failed)
    trainer = ReflectionTrainer(policy.model, rc.trainer, policy.tokenizer.pad_token_id)
    policy.release()  # the tries' caches: no episode goes on with these weights
    record: dict[str, Any] = {"tried": len(tried), "failed": len(failed), "corrected": len(retries)}
    run.log.write("reflection", 0, record)
    console.print(f"reflection: {len(failed)} of {len(tried)} tries failed; {len(retries)} corrected retries")
    with progress(console, "reflection", rc.trainer.steps) as bar:
        for step in range(rc.trainer.steps):
            # batch: corrected retries and demonstrations, then root-cause answers at this step's weight
            rng = random.Random(stream_seed(cfg.seed, "reflection", step, bits=SEED_BITS))
            batch = halves(rng, corrected, imitated, rc.trainer.batch_sessions)
            weight = root_cause_weight(step, rc.trainer.steps, rc.root_cause_weight)
            cause_batch = rng.sample(causes, min(max(rc.trainer.batch_sessions // 2, 1), len(causes)))
            batch += weighted(cause_batch, -weight)
            # update
            stats = trainer.step(batch)
            # log
            record = {"loss": stats.loss, **stats.parts, "root_cause_weight": weight}
            run.log.write("reflection", step, record)
            bar.advance(info=f"loss {stats.loss:.3f}")
    export_policy(policy, run.folder / "reflection_policy")
    return record


def as_the_policy_writes(failed: Sequence[tuple[Session, Reflection]]) -> list[tuple[Session, Reflection]]:
    """The judge's reflections as the policy writes its own (`self_reflect`): the cause and its generic
    plan, so the corrected retries teach the retry to read what it will be given."""
    return [(s, cause_reflection(s.session_id, r.root_cause, r.source)) for s, r in failed]


def practice_tasks(run: Run) -> list[Task]:
    """The `reflection.tasks` training tasks the RL policy tries: the first past the `sft.demos`
    demonstrated ones, or the first of the split when it has too few past them."""
    tasks, n = run.env.tasks(Split.TRAIN), run.config.reflection.tasks
    unseen = tasks[run.config.sft.demos :]
    return list(unseen[:n] if len(unseen) >= n else tasks[:n])


def halves(
    rng: random.Random, first: Sequence[TokenSequence], second: Sequence[TokenSequence], size: int
) -> list[TokenSequence]:
    """A batch of `size`: half drawn from `first` (all it has when it has fewer), the rest from `second`;
    all from one when the other is empty, fewer when both run short.

    >>> len(halves(random.Random(0), ["a"] * 3, ["b"] * 9, 8)), halves(random.Random(0), [], ["b"], 4)
    (8, ['b'])
    """
    take = min(len(first), size // 2 if second else size)
    batch = rng.sample(list(first), take)
    return batch + rng.sample(list(second), min(size - take, len(second)))


def held_out_uplift(
    run: Run, stage2: HFPolicy, stage3: HFPolicy, evaluated: Sequence[Session] = ()
) -> Uplift:
    """CU on the RL policy's failures among the first `reflection.held_out` report-split tasks.

    `evaluated` are the RL policy's evaluation sessions on the report split, if any: they are its first
    attempts (same greedy policy, same seeds), so the tasks they cover are not run again."""
    cfg = run.config
    tasks = run.env.tasks(cfg.evaluation.split)[: cfg.reflection.held_out]
    done = {str(s.metadata["task_id"]): s for s in evaluated}
    first = [done[t.task_id] for t in tasks if t.task_id in done]
    first += attempt(run, stage2, [t for t in tasks if t.task_id not in done], "cu-first", "eval")
    failed = reflect_on(run, first)
    by_id = {t.task_id: t for t in tasks}
    plain = [by_id[str(s.metadata["task_id"])] for s, _ in failed]
    notes: Mapping[str, Reflection] = {s.session_id: r for s, r in failed}
    if cfg.reflection.reflector == "policy":
        notes = self_reflect(run, stage3, [s for s, _ in failed])
    # a failure the policy named no cause for is retried as it was (nothing to read)
    reflected = [
        with_reflection(task, notes[s.session_id]) if s.session_id in notes else task
        for task, (s, _) in zip(plain, failed, strict=True)
    ]

    def marks(flag: bool) -> dict[str, dict[str, Any]]:
        return {str(s.metadata["task_id"]): {"retry_of": s.session_id, "reflected": flag} for s, _ in failed}

    without = attempt(run, stage2, plain, "cu-retry", "cu-retry", marks(False))
    read = [t.instruction for t in reflected]
    trained_weights = weights(stage3.model)  # hashed once, for both retries' ids
    with_ = attempt(
        run, stage3, reflected, f"cu-reflected-{stamp(trained_weights, *read)}", "cu-retry", marks(True)
    )
    untrained = attempt(run, stage2, reflected, f"cu-reflected-rl-{stamp(*read)}", "cu-retry")
    trained = attempt(run, stage3, plain, f"cu-plain-{stamp(trained_weights)}", "cu-retry")
    causes = Counter(r.root_cause.value for _, r in failed)
    return Uplift(
        len(failed),
        tuple(without),
        tuple(with_),
        tuple(untrained),
        causes=dict(sorted(causes.items())),
        trained_without_reflection=tuple(trained),
    )


# the staged run


@dataclass(frozen=True, slots=True)
class StageReport:
    """A stage's policy on the report split: its metrics, CU (measured after reflection only), levels."""

    stage: str
    metrics: AgentMetrics
    cu: float | None
    levels: LevelReport
    sessions: tuple[Session, ...] = ()
    """The stage's evaluation sessions on the report split (what `metrics` were computed from)."""

    def dimensions(self) -> dict[str, float | None]:
        """The five dimensions."""
        m = self.metrics
        return {"tcsr": m.tcsr, "dvr": m.dvr, "er5": m.er5, "cu": self.cu, "spt": m.spt}


@dataclass(frozen=True, slots=True)
class StagesResult:
    """A staged run: the grpo loop's result, each stage's report, and the held-out uplift."""

    train: TrainResult
    stages: tuple[StageReport, ...]
    uplift: Uplift | None


TRAINED = (("imitation", "sft"), ("rejection sampling", "rft"), ("rl", "rl"))
"""The stages the grpo loop reports on, each with the label of the policy it exports."""


def reflected_label(config: RunConfig, result: TrainResult) -> str | None:
    """The exported policy the reflection stage starts from: the last one the loop trained (`rl`; `rft`
    or `sft` for a run of no GRPO iterations, which reflects on a policy trained elsewhere and loaded by
    `model.path`); None when `stages` does not name reflection or the gate stopped the run."""
    if config.stages is None or "reflection" not in config.stages or result.stage is Stage.STOPPED:
        return None
    return next((label for _, label in reversed(TRAINED) if label in result.report), None)


def train_stages(config: RunConfig, *, resume: bool = False, console: Console | None = None) -> StagesResult:
    """Imitation and RL (`train`), then reflection when `config.stages` names it and RL ran; a report
    after each stage (see the module doc).

    With `resume`, an interrupted run goes on from the last checkpoint of the grpo loop (imitation's every
    25 steps, RL's every iteration; a finished stage is not run again). The reflection stage keeps no
    checkpoint: it runs again from `rl_policy/`, and the episodes it had already finished (tries,
    corrected retries, CU retries) are read back from the store, not played again."""
    console = console or Console()
    result = train(config, resume=resume, console=console)
    steps = expert_steps(config.env.build())
    reports = [
        StageReport(stage, e.metrics, None, assess(e.sessions, config.levels, steps_of=steps), e.sessions)
        for stage, label in TRAINED
        if (e := result.report.get(label)) is not None
    ]
    start = reflected_label(config, result)
    if start is None:
        return StagesResult(result, tuple(reports), None)
    with open_run(config) as run:
        load = (run.folder / f"{start}_policy", config.rl.sampling, config.batching)
        run.policy = HFPolicy.load(*load)
        if config.model.lora is not None:
            run.policy.model = with_lora(run.policy.model, config.model.lora)
        reflection_stage(run, console)
        uplift = held_out_uplift(run, HFPolicy.load(*load), run.policy, result.report[start].sessions)
        final = evaluate(run, run.policy, config.evaluation.split, config.evaluation.tasks, "reflection")
        sessions = [*final.sessions, *uplift.without, *uplift.with_reflection]
        levels = assess(sessions, config.levels, steps_of=steps)
        reports.append(StageReport("reflection", final.metrics, uplift.cu, levels, final.sessions))
        for report in reports:
            run.log.write("stages", 0, {"of": report.stage, **report.dimensions(), **report.levels.as_dict()})
    return StagesResult(result, tuple(reports), uplift)


__all__ = [
    "TRAINED",
    "ReflectionTrainer",
    "StageReport",
    "StagesResult",
    "Uplift",
    "as_the_policy_writes",
    "attempt",
    "attempt_faults",
    "corrected_retries",
    "halves",
    "held_out_uplift",
    "kept",
    "practice_tasks",
    "reflect_on",
    "reflected_label",
    "reflection_stage",
    "root_cause_sequences",
    "root_cause_turn",
    "root_cause_weight",
    "self_reflect",
    "stamp",
    "success_by_task",
    "train_stages",
    "transcript",
    "weighted",
    "weights",
]
