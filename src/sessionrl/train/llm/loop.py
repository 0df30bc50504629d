"""The LLM training loop: imitation, a gate, then GRPO (`train`), or imitation alone (`train_sft`);
rollouts, rewards and updates meet in the store.

    sft   expert episodes on training tasks ──▶ store ──▶ demonstrations ──▶ SFT steps ──▶ sft_policy/
          (`sessionrl.train.llm.imitation`)
    gate  evaluation episodes on the gate split; RL starts only if their success reaches the bar
    rft   with an `rft:` section: rounds of sample, judge, imitate (`sessionrl.train.llm.rft`) ──▶ rft_policy/
    rl    per iteration: K episodes per task with the current policy ──▶ store ──▶ reward shaper scores
          them ──▶ trainer reads scored sessions from the change feed (at most `max_lag` versions old)
          ──▶ group-relative advantages ──▶ one GRPO update ──▶ policy version + 1 ──▶ checkpoint;
          with `rl.dev_tasks`, dev tasks judge the weights and undo those that got worse
          (`sessionrl.train.llm.evaluation`, where evaluations live)

Everything a stage does is read back from the store, never handed over in memory, so a resumed run
(`resume=True`) continues from the last checkpoint with the same weights, optimiser, feed cursors and
random states. Each stage reads top to bottom; the maths lives in `sessionrl.train.losses`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from sessionrl.envs.base import Split, Task, stream_seed
from sessionrl.episodes import EpisodeSpec, Ran, progress
from sessionrl.eval.autopause import AutoPause
from sessionrl.eval.curriculum import Curriculum, expert_steps
from sessionrl.eval.levels import LevelReport, assess
from sessionrl.eval.metrics import compute
from sessionrl.policy.llm import HFPolicy, with_lora
from sessionrl.policy.vllm import VLLMEngine
from sessionrl.session.model import Session
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.captured import replayable_tasks, stored_sessions
from sessionrl.train.llm.checkpoint import (
    Stage,
    load_checkpoint,
    read_state,
    save_checkpoint,
    saved_at,
)
from sessionrl.train.llm.data import (
    call_advantages,
    lag,
    merge_turns,
    policy_turns,
    session_advantages,
)
from sessionrl.train.llm.distributed import follow, join, lead, release, step_everywhere
from sessionrl.train.llm.evaluation import (
    DEV_POLICY,
    SEED_BITS,
    DevValidation,
    Evaluation,
    evaluate,
    evaluate_exported,
    in_lockstep,
)
from sessionrl.train.llm.feed import VERDICT_DUE, FeedRead, GroupMemory, read_scored
from sessionrl.train.llm.grpo import GRPOTrainer, frozen_copy
from sessionrl.train.llm.imitation import imitation
from sessionrl.train.llm.run import (
    Run,
    export_policy,
    open_run,
)
from sessionrl.train.llm.update import UpdateStats
from sessionrl.train.llm.watch import (
    UNDONE,
    Guard,
    stop_collapsed,
    trainable_weights,
    warn_blind,
    warn_unsettled,
)

# episodes


def rl_specs(run: Run, iteration: int, pool: Sequence[Task] | None = None) -> list[EpisodeSpec]:
    """K episodes for each of the iteration's training tasks (drawn by a generator named by the iteration)
    from `pool` (the captured sessions' tasks), or by default from the environment's training tasks.

    The K episodes of a group share their environment seed, so the same calls meet the same faults: what
    tells the group's rewards apart is what the policy did (common random numbers for the baseline).
    """
    cfg = run.config
    tasks: Sequence[Task] = run.env.tasks(Split.TRAIN) if pool is None else pool
    if cfg.rl.unseen_tasks and pool is None:
        tasks = tasks[cfg.sft.demos :]
        if not tasks:
            raise ValueError(f"rl.unseen_tasks: no training tasks past the first {cfg.sft.demos} demos")
    chosen = random.Random(stream_seed(cfg.seed, "rl", iteration, bits=SEED_BITS)).sample(
        list(tasks), min(cfg.rl.tasks_per_iteration, len(tasks))
    )
    faults = cfg.faults.at(iteration)
    return [
        EpisodeSpec(
            task=task,
            session_id=f"rl-{iteration:04d}-{task.task_id}-{k}",
            seed=stream_seed(cfg.seed, "rl", iteration, task.task_id, bits=SEED_BITS),
            faults=faults,
            metadata={
                "stage": "rl",
                "iteration": iteration,
                "group": f"{iteration}:{task.task_id}",
                **late_verdict(run, iteration, task.task_id, k),
            },
        )
        for task in chosen
        for k in range(cfg.rl.trainer.group_size)
    ]


def late_verdict(run: Run, iteration: int, task_id: str, k: int) -> dict[str, int]:
    """`{verdict_due: iteration + rl.late_after}` for the share `rl.late_share` of RL sessions (drawn by
    a generator named by the session), whose verdict the reward shaper holds until then; else `{}`."""
    rl = run.config.rl
    draw = random.Random(stream_seed(run.config.seed, "late", iteration, task_id, k, bits=SEED_BITS))
    if rl.late_share > 0 and draw.random() < rl.late_share:
        return {VERDICT_DUE: iteration + rl.late_after}
    return {}


Rollout = Callable[[Sequence[EpisodeSpec], HFPolicy], list[Ran]]
"""Runs RL episodes with the policy as it is now; one `Ran` per spec, in order."""


@contextmanager
def rollouts(run: Run) -> Iterator[Rollout]:
    """Where the RL stage's episodes run: in this process, or on Ray actors with `cluster: {ray: ...}`
    (`sessionrl.cluster.ray_rollout`). Either way they land in the run's store."""
    cfg = run.config
    if cfg.cluster.ray is not None:
        from sessionrl.cluster.ray_rollout import RayRollout

        with RayRollout(cfg, run.need_policy()) as workers:
            yield workers.run
        return

    yield functools.partial(in_lockstep, run)


def replayed_tasks(run: Run, console: Console) -> list[Task]:
    """The training tasks the captured sessions of `sft.store` name, which GRPO replays; each session
    that cannot be replayed is printed and counted with its reason."""
    source = run.config.sft.store
    assert source is not None
    sessions = stored_sessions(source.db, source.filters, source.limit)
    replay = replayable_tasks(sessions, run.env, run.config.env.name)
    for session_id, reason in replay.skipped:
        console.print(f"not replayed: captured session {session_id}: {reason}")
    run.log.write("replay", run.state.step, {"tasks": len(replay.tasks), "skipped": len(replay.skipped)})
    if not replay.tasks:
        raise ValueError(
            f"none of the {len(sessions)} captured sessions names a training task of {run.config.env.name} "
            "to replay (send OpenAI request metadata {env, task_id} with the session's first request)"
        )
    return replay.tasks


def gate(run: Run, console: Console) -> Evaluation:
    """Evaluate the imitation policy on the gate split; the RL stage starts only if it clears the bar. The
    verdict is printed as soon as it is known."""
    bar = run.config.evaluation
    evaluation = evaluate(run, run.need_policy(), bar.gate_split, bar.gate_tasks, "gate")
    passed = evaluation.metrics.success >= bar.gate_min_success and levels_gate(run, evaluation)
    next_stage = (Stage.RFT if run.config.rft is not None else Stage.RL) if passed else Stage.STOPPED
    run.state = dataclasses.replace(run.state, stage=next_stage, step=0)
    save_checkpoint(run.folder / "checkpoint", run.need_policy().model, None, run.state, run.generators)
    console.print(gate_verdict(run.config, evaluation.metrics.success, passed), soft_wrap=True)
    return evaluation


def gate_verdict(config: RunConfig, success: float | None, passed: bool) -> str:
    """The gate's verdict in one line (`success` None: not known, as after a resume without its record)."""
    bar = config.evaluation
    levels = f" and levels {', '.join(config.levels.gate)}" if config.levels.gate else ""
    reached = "?" if success is None else f"{success:.3f}"
    verdict = (
        f"passed: {rl_stages(config)} starts"
        if passed
        else f"not passed: {rl_stages(config)} does not start (sft_policy/ is kept)"
    )
    return (
        f"gate: the imitation policy's success on {bar.gate_tasks} {bar.gate_split} tasks is {reached}"
        f" (bar {bar.gate_min_success:g}{levels}); {verdict}"
    )


def rl_stages(config: RunConfig) -> str:
    """The stages the gate lets start, as the verdict names them.

    >>> rl_stages(RunConfig.model_validate({"rft": {"rounds": 2}, "rl": {"iterations": 0}}))
    'rejection sampling'
    >>> staged, none = {"stages": ["imitation", "rl", "reflection"]}, {"rl": {"iterations": 0}}
    >>> rl_stages(RunConfig.model_validate(staged)), rl_stages(RunConfig.model_validate(none))
    ('GRPO then reflection', 'the evaluation')
    """
    stages = (
        (["rejection sampling"] if config.rft is not None else [])
        + (["GRPO"] if config.rl.iterations > 0 else [])
        + (["reflection"] if config.stages is not None and "reflection" in config.stages else [])
    )
    return " then ".join(stages) or "the evaluation"


def logged_gate(run: Run) -> float | None:
    """The gate's success as the run's metrics log kept it (a resumed run's gate ran before), or None."""
    records = [json.loads(line) for line in run.log.path.read_text("utf-8").splitlines() if line.strip()]
    gates = [r for r in records if r.get("stage") == "eval" and r.get("label") == "gate"]
    return float(gates[-1]["success"]) if gates else None


def levels_gate(run: Run, evaluation: Evaluation) -> bool:
    """Whether the gate's sessions pass every level `levels.gate` names (the seed: L1 and L2 before
    planning-heavy RL); the levels are logged (`levels` record) whenever a gate is configured."""
    levels = run.config.levels
    if not levels.gate:
        return True
    report = assess(evaluation.sessions, levels, steps_of=expert_steps(run.env))
    run.log.write("levels", run.state.policy_version, {"label": evaluation.label, **report.as_dict()})
    return report.passed(levels.gate)


# reinforcement learning


@dataclass(frozen=True, slots=True)
class Learned:
    """What one learning step took from the feed and did with it."""

    read: FeedRead
    session_ids: tuple[str, ...]
    stats: UpdateStats | None
    late: int = 0
    """Sessions trained on that an older policy version sampled (their verdict came late)."""


def learn(
    run: Run, trainer: GRPOTrainer, console: Console | None = None, memory: GroupMemory | None = None
) -> Learned:
    """Read scored sessions from the feed, compute advantages, update once; advance the cursor. Sessions
    sampled more than `rl.max_lag` versions ago are left out and said on `console` (`StaleFeed` when
    nothing else came). With `memory`, each session is ranked against its whole group, peers trained
    before it included (a late session's group trained without it); the read sessions join it."""
    cfg, policy = run.config.rl, run.need_policy()
    read = read_scored(run.store, run.state.cursor, stage="rl", version=policy.version, max_lag=cfg.max_lag)
    if (note := read.stale_note(cfg.max_lag)) is not None:
        (console or Console()).print(note, markup=False, highlight=False)
    read.require_fresh(cfg.max_lag)
    scored = sorted(read.fresh, key=lambda s: s.session.session_id)
    # advantages: each session against its group, then per policy call
    rewards = {s.session.session_id: s.reward(cfg.trainer.reward) for s in scored}
    groups = {s.session.session_id: str(s.session.metadata["group"]) for s in scored}
    advantage = session_advantages(*(memory.ranked(rewards, groups) if memory else (rewards, groups)))
    if memory is not None:
        memory.remember(scored, cfg.trainer.reward, oldest=run.state.step - cfg.max_lag - cfg.late_after)
    late = sum(lag(s.session, policy.version) > 0 for s in scored)
    sequences = [
        seq
        for s in scored
        for seq in merge_turns(
            policy_turns(
                s.session,
                call_advantages(
                    s.session, advantage[s.session.session_id], s.step_rewards, cfg.trainer.step_coef
                ),
            ),
            s.session.session_id,
        )
    ]
    # update: in an order set by the sequences alone, since which of a group's identical episodes drew
    # which reply is not (see `sessionrl.train.llm.lockstep`)
    sequences.sort(key=lambda q: (q.input_ids, q.advantages, q.old_logprobs))
    sequences = [seq for seq in sequences if cfg.trainer.moves(seq.advantages)]
    policy.release()  # the rollouts' caches: no episode goes on with these weights
    stats = step_everywhere(trainer, sequences) if sequences else None
    run.state = dataclasses.replace(
        run.state,
        cursor=read.cursor,
        stale=run.state.stale + read.stale,
        trained_sessions=run.state.trained_sessions + len(scored),
    )
    return Learned(read, tuple(rewards), stats, late)


def start_rl(run: Run, resume: bool) -> GRPOTrainer:
    """The GRPO trainer (its KL reference is the exported imitation policy), restored on resume."""
    policy = run.need_policy()
    reference = None
    if run.config.rl.trainer.kl_coef > 0:
        reference = frozen_copy(HFPolicy.load(run.folder / "sft_policy").model)
    trainer = GRPOTrainer(policy.model, run.config.rl.trainer, policy.tokenizer.pad_token_id, reference)
    if resume:
        run.state = load_checkpoint(
            run.folder / "checkpoint", policy.model, trainer.optimizer, run.generators
        )
        trainer.updates = run.state.updates
    policy.version = run.state.policy_version
    return lead(trainer, resumed=resume)  # under torchrun, the other ranks build theirs and take its weights


def reinforce(
    run: Run, console: Console, resume: bool, on_iteration: Callable[[dict[str, Any]], None]
) -> None:
    """The RL stage: rollout, rewards, learn, log and checkpoint, once per iteration."""
    cfg, policy = run.config, run.need_policy()
    trainer = start_rl(run, resume)
    memory = GroupMemory()  # a resumed run ranks late sessions against the peers read after it resumed
    if resume and cfg.rl.late_share > 0:  # a scan of every session: only when verdicts can be late
        run.shaper.recall(run.state.step)
    pool = replayed_tasks(run, console) if cfg.sft.store is not None else None
    curriculum = rl_curriculum(run) if cfg.rl.curriculum and pool is None else None
    reached: LevelReport | None = None  # the levels the last rollouts reached (the curriculum's promotion)
    watch = AutoPause(cfg.auto_pause, run.folder) if cfg.auto_pause is not None else None
    guard = Guard(cfg.rl.collapse, policy.model, run.folder, run.state.curve)
    validation = (
        DevValidation.start(
            run, "rl", cfg.rl.dev_tasks, run.folder / DEV_POLICY, tools=cfg.rl.dev_tool_accuracy
        )
        if cfg.rl.dev_tasks
        else None
    )
    started = time.monotonic()
    with (
        rollouts(run) as rollout,
        progress(console, "reinforce", cfg.rl.iterations, completed=run.state.step) as bar,
    ):
        for iteration in range(run.state.step, cfg.rl.iterations):
            if cfg.rl.minutes is not None and time.monotonic() - started > 60 * cfg.rl.minutes:
                break
            ticks = [time.monotonic()]
            # rollout
            tasks = pool if curriculum is None else curriculum_pool(run, curriculum, reached, iteration)
            ran = rollout(rl_specs(run, iteration, tasks), policy)
            if curriculum is not None:
                reached = assess(
                    [run.store.get(r.session_id) for r in ran], cfg.levels, steps_of=expert_steps(run.env)
                )
            ticks.append(time.monotonic())
            # rewards
            reward_cursor, _ = run.shaper.follow(run.state.reward_cursor, now=iteration)
            run.state = dataclasses.replace(run.state, reward_cursor=reward_cursor)
            ticks.append(time.monotonic())
            # learn: feed, advantages, update
            learned = learn(run, trainer, console, memory)
            policy.version += 1  # the engine serves the updated weights as the next version
            ticks.append(time.monotonic())
            # log
            record = _iteration_record(iteration, ran, learned, ticks, policy.version)
            sessions = [run.store.get(r.session_id) for r in ran]
            verdict = guard.judge(iteration, sessions, record)  # adds the rollouts' parse share and TCSR
            if iteration == 0:  # the imitation policy's rollouts: the watch's baseline
                warn_blind(run, guard, console)
            # a collapsing iteration's weights are not the ones RL ends on: after the rollback, the
            # judgement below the loop judges those
            if validation is not None and due(cfg.rl.dev_every, iteration) and not verdict.collapsed:
                trainer = validated(run, validation, iteration, trainer, guard, console)
                if validation.undid:  # a resumed guard ends its streak there too
                    record[UNDONE] = True
            run.log.write("rl", iteration, record)
            on_iteration(record)
            run.state = dataclasses.replace(
                run.state,
                step=iteration + 1,
                policy_version=policy.version,
                updates=trainer.updates,
                curve=(*run.state.curve, record),
            )
            save_checkpoint(
                run.folder / "checkpoint", policy.model, trainer.optimizer, run.state, run.generators
            )
            bar.advance(info=f"success {record['success']:.2f}")
            if verdict.collapsed:
                stop_collapsed(run, guard, verdict, sessions, console, judged=validation is not None)
                run.state = dataclasses.replace(run.state, stage=Stage.PAUSED)
                save_checkpoint(run.folder / "checkpoint", policy.model, None, run.state, run.generators)
                break
            if watch is not None and paused(run, watch, iteration, ran, console):
                break
    unheard(run, console)
    if validation is not None and validation.judged < run.state.step - 1:  # the last iterations
        validation.judge(run, run.state.step - 1, console)
        run.state = dataclasses.replace(run.state, policy_version=policy.version)
        save_checkpoint(run.folder / "checkpoint", policy.model, None, run.state, run.generators)
    undone = validation is not None and validation.undid
    warn_unsettled(run, guard, console, "the weights dev validation kept" if undone else "the last update")
    export_policy(policy, run.folder / "rl_policy")


def due(every: int, iteration: int) -> bool:
    """Whether `rl.dev_every` judges the weights iteration `iteration` (0-based) ended on (0: none
    before the last, which is judged after the loop)."""
    return every > 0 and (iteration + 1) % every == 0


def validated(
    run: Run, validation: DevValidation, iteration: int, trainer: GRPOTrainer, guard: Guard, console: Console
) -> GRPOTrainer:
    """Judge iteration `iteration`'s weights on the dev tasks. Kept: `trainer` goes on. Undone: a fresh
    trainer on the restored weights (rank 0's, on every rank), so no optimiser moment of the undone
    updates pushes the next ones; the collapse guard's pending weights are the restored ones too, and its
    unhealthy streak, played by the undone weights, ends."""
    if validation.judge(run, iteration, console):
        return trainer
    guard.undone(trainable_weights(run.need_policy().model))
    fresh = GRPOTrainer(trainer.model, trainer.config, trainer.pad_id, trainer.reference)
    fresh.updates = trainer.updates  # the KL coefficient's decay goes on
    return lead(fresh)


def unheard(run: Run, console: Console) -> None:
    """Say and log (`late` record) how many late sessions' verdicts were still due when RL ended: they
    were sampled and judged, but never trained on."""
    if held := len(run.shaper.held):
        run.log.write("late", run.state.step, {"unheard": held})
        console.print(f"{held} late sessions' verdicts were due after the last RL iteration: not trained on")


def rl_curriculum(run: Run) -> Curriculum:
    """The RL stage's curriculum over the training tasks it may draw (past the demonstrated ones with
    `rl.unseen_tasks`), each with the level it needs."""
    cfg = run.config
    tasks = run.env.tasks(Split.TRAIN)
    return Curriculum.of(run.env, tasks[cfg.sft.demos :] if cfg.rl.unseen_tasks else tasks, cfg.levels)


def curriculum_pool(
    run: Run, curriculum: Curriculum, reached: LevelReport | None, iteration: int
) -> list[Task]:
    """The tasks `reached` unlocks (`Curriculum.pool`), logged as the iteration's `curriculum` record."""
    tasks = curriculum.pool(reached)
    top = reached.reached.value if reached is not None and reached.reached is not None else None
    run.log.write(
        "curriculum",
        iteration,
        {"reached": top, "limit": curriculum.limit(reached).value, "tasks": len(tasks)},
    )
    return tasks


def paused(run: Run, watch: AutoPause, iteration: int, ran: Sequence[Ran], console: Console) -> bool:
    """Feed the iteration's rollouts to auto-pause; True (logged, said) once it pauses the run."""
    sessions = [run.store.get(r.session_id) for r in ran]
    if not watch.observe(f"rl-{iteration}", compute(sessions), sessions):
        return False
    run.log.write("paused", iteration, {"metric": watch.config.metric, "history": watch.history})
    console.print(f"paused: {watch.config.metric} fell {watch.falls} times in a row; see pause_report.json")
    return True


def _iteration_record(
    iteration: int, ran: Sequence[Ran], learned: Learned, ticks: Sequence[float], version: int
) -> dict[str, Any]:
    """What an iteration did; `ticks` are its start and the ends of its rollout, rewards and learning
    (so the record says where its time went)."""
    start, rolled, rewarded, learnt = ticks
    record: dict[str, Any] = {
        "iteration": iteration,
        "policy_version": version,
        "success": sum(r.success for r in ran) / max(len(ran), 1),
        "sessions": len(learned.session_ids),
        "stale": learned.read.stale,
        "late": learned.late,
        "seconds": round(learnt - start, 2),
        "rollout_s": round(rolled - start, 2),
        "rewards_s": round(rewarded - rolled, 2),
        "learn_s": round(learnt - rewarded, 2),
    }
    if learned.stats is not None:
        record |= learned.stats.as_record()
    return record


# the whole run


@dataclass(frozen=True, slots=True)
class TrainResult:
    """What a run produced: its stage at the end, the gate's evaluation, the learning curve, and the final
    report (each exported policy evaluated on the report split, by label)."""

    stage: Stage
    gate: Evaluation | None
    curve: tuple[dict[str, Any], ...]
    report: dict[str, Evaluation]


def start_run(config: RunConfig, resume: bool) -> Run:
    """The run's parts (`open_run`); a new run (not `resume`) refuses a folder that already holds one. A
    resumed run drops the metrics logged after its checkpoint (all of them without one): it does that
    work again and logs it again."""
    if not resume and (config.run_dir / "sessions.db").exists():
        raise FileExistsError(f"{config.run_dir} already holds a run; resume it or choose another run_dir")
    run = open_run(config)
    if resume:
        run.log.rewind(saved_at(run.folder / "checkpoint") or 0.0)
    return run


def train_sft(config: RunConfig, *, resume: bool = False, console: Console | None = None) -> TrainResult:
    """`trainer: sft`: the imitation stage alone (continued with `resume`), then `sft_policy/` evaluated on
    the report split."""
    if join() != 0:  # under torchrun, a rank other than 0
        return followed(config)
    console = console or Console()
    with start_run(config, resume) as run:
        try:
            imitation(run, console, resume=resume)
        finally:
            release()
        report = evaluate_exported(run, config.evaluation.split, config.evaluation.tasks)
        return TrainResult(run.state.stage, None, (), report)


def train(
    config: RunConfig,
    *,
    resume: bool = False,
    console: Console | None = None,
    on_iteration: Callable[[dict[str, Any]], None] = lambda _: None,
) -> TrainResult:
    """`trainer: grpo`: imitation, the gate, rejection sampling when `config.rft` is set, then GRPO (or,
    with `resume`, the rest of them); returns where the stages ended and the exported policies' report."""
    if join() != 0:  # under torchrun, a rank other than 0
        return followed(config)
    console = console or Console()
    with start_run(config, resume) as run:
        saved = read_state(run.folder / "checkpoint") if resume else None
        gated: Evaluation | None = None
        demos: list[Session] | None = None  # a resumed run past imitation reads them back if it needs them
        try:
            if saved is None or saved.stage is Stage.SFT:
                demos = imitation(run, console, resume=saved is not None)
                gated = gate(run, console)
            else:
                run.policy = resumed_policy(run)
                run.state = saved
                passed = saved.stage is not Stage.STOPPED
                console.print(gate_verdict(config, logged_gate(run), passed), soft_wrap=True)
            if run.state.stage is Stage.RFT:
                from sessionrl.train.llm.rft import warm_start  # rft builds on this module's stages

                warm_start(run, console, demos)
            if run.state.stage is Stage.RL and config.rl.iterations > 0:
                reinforce(run, console, saved is not None and saved.stage is Stage.RL, on_iteration)
        finally:
            release()
        report = evaluate_exported(run, config.evaluation.split, config.evaluation.tasks)
        return TrainResult(run.state.stage, gated, tuple(dict(r) for r in run.state.curve), report)


def followed(config: RunConfig) -> TrainResult:
    """A rank other than 0 of a `torchrun` launch: it takes every update rank 0 leads it through
    (`sessionrl.train.llm.distributed`) and holds nothing else; the run and its report are rank 0's."""
    follow(config)
    return TrainResult(Stage.SFT, None, (), {})


def resumed_policy(run: Run) -> HFPolicy:
    """The imitation policy as exported (with fresh LoRA adapters when configured); a checkpoint's
    weights are loaded into it next."""
    cfg = run.config
    policy = HFPolicy.load(run.folder / "sft_policy", cfg.rl.sampling, cfg.batching)
    if cfg.model.lora is not None:
        policy.model = with_lora(policy.model, cfg.model.lora)
    if cfg.model.vllm is not None:
        policy.use(VLLMEngine(cfg.model.vllm, stop_ids=policy.stop_ids, version=policy.version))
    if cfg.model.engine == "ortgenai":
        from sessionrl.policy.ortgenai import for_policy  # the ort extra, needed only when chosen

        policy.use(for_policy(policy, run.folder / "sft_policy", cfg.model.cache))
    return policy
