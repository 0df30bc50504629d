"""Evaluating a run's policy, and the dev tasks' judgement of a stage's updates.

`evaluate` plays one greedy episode (at `evaluation.temperature`) on each of a split's first tasks, in
lockstep (`in_lockstep`), and logs an `eval` record. `DevValidation` uses it to judge a training stage
on dev tasks (`rft.dev_tasks` for the rejection-sampling rounds, `rl.dev_tasks` for GRPO's iterations):

    start   the weights the stage starts from ──▶ N dev tasks ──▶ solved s0, the kept weights
    judge   after a round (rft) or every `rl.dev_every` iterations and after the last (rl): solved s
            s >= kept ──▶ these weights are kept          s < kept ──▶ undone: the kept weights come back

So a stage never ends on weights that solve fewer dev tasks than those it started from. With
`dev_tool_accuracy`, per-turn tool accuracy judges too: weights are kept only when they also get at least
as many of the same tasks' gold turns exactly right (`exact_on_dev`), so an update that solves a task more
by luck while its calls got worse is undone. Each verdict is printed and logged (`rft_dev` or `rl_dev`
records: `before`, `solved`, `kept`, and `exact_before`, `exact`, `turns` when tool accuracy judges; the
evaluations are `eval` records labelled `rft-dev-<n>` or `rl-dev-<n>`, 0 for the starting weights). RL's
validation keeps its weights in the run folder (`dev_policy.safetensors`), so a resumed run judges
against them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from rich.console import Console

from sessionrl.envs.base import Split, Task, stream_seed
from sessionrl.envs.faults import Faults
from sessionrl.episodes import EpisodeSpec, Ran, run_episodes, settle
from sessionrl.episodes.verdict import task_success
from sessionrl.eval.metrics import AgentMetrics, compute
from sessionrl.eval.tool_accuracy import ToolAccuracy
from sessionrl.policy.llm import HFPolicy
from sessionrl.session.model import Session
from sessionrl.train.config import EXPORTED
from sessionrl.train.llm.accuracy import measure_tool_accuracy
from sessionrl.train.llm.checkpoint import stamp, weights
from sessionrl.train.llm.lockstep import Lockstep, LockstepAgent
from sessionrl.train.llm.run import Run, evaluation_view
from sessionrl.train.llm.watch import read_weights, restore_weights, save_weights, trainable_weights

SEED_BITS = 31
"""Width of the seeds the loop draws (episodes, task samples, demo shuffles); fixed, so a seeded run draws
the same streams as earlier runs with that seed."""


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A labelled evaluation: the metrics and the sessions they came from."""

    label: str
    metrics: AgentMetrics
    sessions: tuple[Session, ...]
    tools: ToolAccuracy | None = None
    """Per-turn tool accuracy on the same tasks (`sessionrl.train.llm.accuracy`), where it was measured."""


def once_per_task(
    seed: int,
    tasks: Sequence[Task],
    stream: str,
    prefix: str,
    faults: Faults,
    metadata: Mapping[str, Any],
) -> list[EpisodeSpec]:
    """One episode per task, in session `<prefix>-<task id>`, seeded by the task alone within `stream`
    (so any two runs of the same tasks meet the same faults)."""
    return [
        EpisodeSpec(
            task=task,
            session_id=f"{prefix}-{task.task_id}",
            seed=stream_seed(seed, stream, task.task_id, bits=SEED_BITS),
            faults=faults,
            metadata=dict(metadata),
        )
        for task in tasks
    ]


def evaluate(
    run: Run, policy: HFPolicy, split: Split, n_tasks: int, label: str, *, tools: bool = False
) -> Evaluation:
    """Episodes on the first `n_tasks` of `split` (greedy unless `evaluation.temperature` > 0), with the
    evaluation fault rate; with `tools`, the per-turn tool accuracy on the same tasks too (its keys join
    the `eval` record: `tool_acc`, `tool_name_acc`, `tool_parse_rate`, ...).

    Episode seeds depend on the task only, so two policies evaluated under different labels meet the same
    faults on the same tasks. Session ids carry a digest of the policy's weights: an interrupted evaluation
    reads back the episodes it finished, but a resumed run whose policy has trained further evaluates anew.
    """
    cfg = run.config
    view = evaluation_view(policy, cfg.evaluation.max_new_tokens, cfg.evaluation.temperature)
    faults = cfg.faults.fixed(cfg.faults.eval_rate)
    tasks = run.env.tasks(split)[:n_tasks]
    prefix = f"eval-{label}-{stamp(weights(policy.model))}"
    specs = once_per_task(cfg.seed, tasks, "eval", prefix, faults, {"stage": "eval", "label": label})
    ran = in_lockstep(run, specs, view)
    sessions = tuple(run.store.get(r.session_id) for r in ran)
    metrics = compute(sessions, ks=(1,))
    accuracy = measure_tool_accuracy(run, policy, split, n_tasks) if tools else None
    policy.release()  # what the engine kept for these episodes and turns: none of them goes on
    measured = accuracy.as_dict() if accuracy is not None else {}
    run.log.write("eval", run.state.policy_version, {"label": label, **metrics.as_dict(), **measured})
    return Evaluation(label, metrics, sessions, accuracy)


def evaluate_exported(run: Run, split: Split, n_tasks: int, prefix: str = "") -> dict[str, Evaluation]:
    """The run's exported policies (`<label>_policy/` for each label of `EXPORTED`, where present)
    evaluated on the same tasks under labels `<prefix><label>`, with their per-turn tool accuracy; keyed
    by label. The run's live policy is let go first: the report is on the exported weights, and nothing
    here reads the live ones."""
    cfg, report = run.config, {}
    run.policy = None
    for label in EXPORTED.values():
        folder = run.folder / f"{label}_policy"
        if folder.is_dir():
            policy = HFPolicy.load(folder, cfg.rl.sampling, cfg.batching)
            report[label] = evaluate(run, policy, split, n_tasks, f"{prefix}{label}", tools=True)
    return report


def in_lockstep(run: Run, specs: Sequence[EpisodeSpec], policy: HFPolicy) -> list[Ran]:
    """Run `policy` on `specs` in this process, its calls batched round by round (`Lockstep`), so the
    same seed samples the same replies whatever the machine's timing; one `Ran` per spec, in order."""
    cfg = run.config
    to_run = sum(settle(run.store, spec)[1] is None for spec in specs)
    agent = LockstepAgent(Lockstep(policy, to_run), policy.version)
    wide = dataclasses.replace(cfg.rollout, concurrency=max(cfg.rollout.concurrency, len(specs)))
    return asyncio.run(run_episodes(run.env, specs, agent, run.store, wide, orchestrator=cfg.orchestrator))


# the dev tasks' judgement


def solved_on_dev(run: Run, tasks: int, label: str) -> int:
    """How many of the first `tasks` dev tasks the run's policy solves greedily (an `eval` record)."""
    evaluation = evaluate(run, run.need_policy(), Split.DEV, tasks, label)
    return sum(1 for s in evaluation.sessions if task_success(s))


def exact_on_dev(run: Run, tasks: int) -> tuple[int, int]:
    """How many gold turns of the first `tasks` dev tasks the run's policy answers with the right tool and
    the exact arguments (per-turn tool accuracy, greedy), and how many were scored."""
    measured = measure_tool_accuracy(run, run.need_policy(), Split.DEV, tasks)
    run.need_policy().release()
    return sum(t.exact for t in measured.turns), len(measured.turns)


ValidatedStage = Literal["rft", "rl"]
"""The stages dev tasks judge: the rejection-sampling rounds, and GRPO."""
UNIT: dict[ValidatedStage, str] = {"rft": "round", "rl": "iteration"}
"""What each judged stage counts its updates in (the key of its `<stage>_dev` records)."""

DEV_POLICY = "dev_policy.safetensors"
"""RL's kept weights in the run folder, with the dev tasks they solved (metadata)."""


@dataclass(frozen=True, slots=True)
class DevScore:
    """What weights score on the judged dev tasks: the tasks they solve and, when tool accuracy judges
    too, the gold turns they get exactly right (of `turns`)."""

    solved: int
    exact: int | None = None
    turns: int = 0

    def holds(self, kept: DevScore) -> bool:
        """Whether these weights do at least as well as the `kept` ones on every measure judged."""
        fewer_exact = self.exact is not None and kept.exact is not None and self.exact < kept.exact
        return self.solved >= kept.solved and not fewer_exact

    def as_record(self) -> dict[str, int]:
        turns = {} if self.exact is None else {"exact": self.exact, "turns": self.turns}
        return {"solved": self.solved, **turns}


def dev_score(run: Run, tasks: int, label: str, tools: bool) -> DevScore:
    """The run's policy on the first `tasks` dev tasks; with `tools`, its per-turn tool accuracy too."""
    solved = solved_on_dev(run, tasks, label)
    if not tools:
        return DevScore(solved)
    exact, turns = exact_on_dev(run, tasks)
    return DevScore(solved, exact, turns)


@dataclass(slots=True)
class DevValidation:
    """The dev tasks' judgement of one stage (see the module doc): the weights kept so far and what they
    score on the dev tasks."""

    stage: ValidatedStage
    tasks: int
    score: DevScore
    weights: dict[str, torch.Tensor]
    judged: int = -1
    """The last round or iteration judged (-1: none yet)."""
    path: Path | None = None
    """Where the kept weights persist (RL), or None (the rounds restart on resume)."""
    undid: bool = False
    """Whether the last verdict undid its round or iteration (the weights are those kept before it)."""

    @property
    def tools(self) -> bool:
        """Whether per-turn tool accuracy judges too (`<stage>.dev_tool_accuracy`)."""
        return self.score.exact is not None

    @classmethod
    def start(
        cls, run: Run, stage: ValidatedStage, tasks: int, path: Path | None = None, *, tools: bool = False
    ) -> DevValidation:
        """The weights the stage starts from, evaluated on the first `tasks` dev tasks (with `tools`, their
        tool accuracy too); or, when `path` holds a validation of the same kind (a resumed run), what it
        kept."""
        tasks = min(tasks, len(run.env.tasks(Split.DEV)))  # the evaluation takes no more than there are
        if tasks == 0:
            raise ValueError(
                f"{stage}.dev_tasks needs dev tasks, and the environment has none (its `dev` size)"
            )
        if path is not None and path.is_file():
            return cls.read(path, stage, tasks, tools)
        score = dev_score(run, tasks, f"{stage}-dev-0", tools)
        validation = cls(stage, tasks, score, trainable_weights(run.need_policy().model), path=path)
        validation.save()
        return validation

    @classmethod
    def read(cls, path: Path, stage: ValidatedStage, tasks: int, tools: bool) -> DevValidation:
        """The validation a run left in `path`; it must have judged `tasks` dev tasks, on tool accuracy
        too when `tools`."""
        weights, meta = read_weights(path)
        same = "resume with the value the run started with"
        if int(meta["tasks"]) != tasks:
            raise ValueError(
                f"{path} judged {meta['tasks']} dev tasks and {stage}.dev_tasks now asks {tasks}: {same}"
            )
        if ("exact" in meta) != tools:
            was = "with" if "exact" in meta else "without"
            raise ValueError(
                f"{path} judged {was} tool accuracy and {stage}.dev_tool_accuracy is now"
                f" {str(tools).lower()}: {same}"
            )
        exact = int(meta["exact"]) if "exact" in meta else None
        score = DevScore(int(meta["solved"]), exact, int(meta.get("turns", 0)))
        return cls(stage, tasks, score, weights, int(meta["judged"]), path)

    def save(self) -> None:
        if self.path is not None:
            meta = {"tasks": self.tasks, "judged": self.judged, **self.score.as_record()}
            save_weights(self.path, self.weights, {k: str(v) for k, v in meta.items()})

    def judge(self, run: Run, step: int, console: Console) -> bool:
        """Evaluate the weights round or iteration `step` (0-based) ended on; keep them when they do at
        least as well on the dev tasks as the kept ones (`DevScore.holds`), else restore those. Says which
        and logs it; True when kept."""
        policy, unit = run.need_policy(), UNIT[self.stage]
        score = dev_score(run, self.tasks, f"{self.stage}-dev-{step + 1}", self.tools)
        before, kept = self.score, score.holds(self.score)
        if kept:
            self.score, self.weights = score, trainable_weights(policy.model)
        else:
            source = f"the weights {self.stage} kept before {unit} {step + 1}"
            restore_weights(policy.model, self.weights, source)
            policy.version += 1  # the engine serves the restored weights from now on
        self.judged, self.undid = step, not kept
        self.save()
        turns = {} if before.exact is None else {"exact_before": before.exact}
        record = {unit: step, "dev_tasks": self.tasks, "before": before.solved, **turns, **score.as_record()}
        run.log.write(f"{self.stage}_dev", step, {**record, "kept": kept})
        said = f"{score.solved} of {self.tasks} dev tasks solved, against {before.solved} before it"
        if score.exact is not None:
            said += f"; {score.exact} of {score.turns} gold turns exact, against {before.exact}"
        verdict = "kept" if kept else "undone: the weights kept before it come back"
        console.print(f"{self.stage} {unit} {step + 1}: {said}; {verdict}", markup=False, highlight=False)
        return kept


__all__ = [
    "DEV_POLICY",
    "SEED_BITS",
    "DevScore",
    "DevValidation",
    "Evaluation",
    "dev_score",
    "evaluate",
    "evaluate_exported",
    "exact_on_dev",
    "in_lockstep",
    "once_per_task",
    "solved_on_dev",
]
