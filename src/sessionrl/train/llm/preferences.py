"""DPO runs (`trainer: dpo`): imitation, then preference pairs drawn from episodes' outcomes, then DPO.

Pairs from outcomes
-------------------
After imitation, the imitation policy plays `dpo.episodes_per_task` episodes of each of the first
`dpo.tasks` demonstrated training tasks, sampling as `dpo.sampling` says, with the tool-fault rate the
`faults.schedule` starts at. The episodes of a task share their environment seed, so they meet the same
faults and only the policy tells them apart.

Within a task, an episode the environment judged solved is preferred to one it did not solve: the solved
sampled episodes and the expert's demonstration of the task are the winners, the unsolved sampled
episodes the losers. A winner and a loser are compared where they part: the first reply each gives to the
same conversation (equal messages) with different texts. Each loser gets at most one pair, against the
first winner it parts from (sampled winners before the expert); a loser whose conversation differs from
every winner's before their replies do gets none.

A pair is written to the store as a `PREFERENCE` feedback on the losing session, by the convention of
`sessionrl.train.llm.dpo`: the winner's reply as `chosen` text, the losing call as `rejected_call_id`, and
the winning session as `chosen_session`. The trainer then reads every preference of the run's store back
(`dpo.stored_preferences`), so preferences an annotator added to those sessions count too.

`DPOTrainer` trains the imitation policy against a frozen copy of itself; `dpo_policy/` is exported and
evaluated beside `sft_policy/`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from rich.console import Console

from sessionrl.envs.base import Split
from sessionrl.episodes import run_episodes
from sessionrl.episodes.llm import PolicyAgent
from sessionrl.policy.llm import HFPolicy
from sessionrl.session import FeedbackAdded
from sessionrl.session.model import Feedback, FeedbackType, LLMCall, Session
from sessionrl.train.config import DPOSection, RunConfig
from sessionrl.train.llm.checkpoint import Stage
from sessionrl.train.llm.data import Reply, demonstration_replies
from sessionrl.train.llm.dpo import DPOTrainer, stored_preferences
from sessionrl.train.llm.evaluation import evaluate_exported, once_per_task
from sessionrl.train.llm.imitation import imitation
from sessionrl.train.llm.loop import TrainResult, start_run
from sessionrl.train.llm.run import Run, export_policy

ANNOTATOR = "outcome"
"""`annotator` of the preferences this module writes."""


def parting(winner: Sequence[Reply], loser: Sequence[LLMCall]) -> tuple[Reply, LLMCall] | None:
    """Where two episodes part: the first reply of `winner` and call of `loser` that answer the same
    messages with different texts; None when their conversations differ first, or one ends first.

    >>> from sessionrl.session.model import Message
    >>> asked = (Message(role="user", content="Is SKU-1 in stock?"),)
    >>> good, bad = Reply(asked, '{"finish": "yes"}'), LLMCall(call_id="c0", messages=asked, response="no")
    >>> parting([good], [bad]) == (good, bad)
    True
    >>> parting([good], [bad.model_copy(update={"response": good.text})]) is None
    True
    """
    for reply, call in zip(winner, loser, strict=False):
        if reply.messages != call.messages:
            return None
        if reply.text != call.response:
            return reply, call
    return None


def outcome_preferences(
    winners: Sequence[tuple[str, Sequence[Reply]]], losers: Sequence[Session]
) -> list[tuple[str, Feedback]]:
    """One task's pairs (see the module doc): `winners` are (session id, replies) in order of preference
    for pairing; each pair is the feedback to add and the id of the losing session it belongs on."""
    found = []
    for loser in losers:
        for winner_id, replies in winners:
            parted = parting(replies, loser.llm_calls)
            if parted is None:
                continue
            chosen, rejected = parted
            data = {"chosen": chosen.text, "rejected_call_id": rejected.call_id, "chosen_session": winner_id}
            comment = f"{winner_id} solved the task and {loser.session_id} did not"
            feedback = Feedback(type=FeedbackType.PREFERENCE, annotator=ANNOTATOR, comment=comment, data=data)
            found.append((loser.session_id, feedback))
            break
    return found


def sample_pairs(run: Run, section: DPOSection, demos: Sequence[Session]) -> int:
    """Play the imitation policy on the demonstrated tasks, write the outcome pairs to the store and
    return how many were written (see the module doc)."""
    cfg, policy = run.config, run.need_policy()
    by_task = {str(d.metadata["task_id"]): d for d in demos}
    tasks = [t for t in run.env.tasks(Split.TRAIN) if t.task_id in by_task][: section.tasks]
    faults = cfg.faults.at(0)
    specs = [
        spec
        for k in range(section.episodes_per_task)
        for spec in once_per_task(cfg.seed, tasks, "dpo", f"dpo-{k}", faults, {"stage": "dpo", "sample": k})
    ]
    agent = PolicyAgent(policy.view(section.sampling), policy.version)
    batch = run_episodes(run.env, specs, agent, run.store, cfg.rollout, orchestrator=cfg.orchestrator)
    ran = asyncio.run(batch)
    solved = {r.session_id for r in ran if r.success}
    episodes: dict[str, list[Session]] = {}
    for r in ran:
        session = run.store.get(r.session_id)
        episodes.setdefault(str(session.metadata["task_id"]), []).append(session)
    written = 0
    for task in tasks:
        group = episodes.get(task.task_id, [])
        demo = by_task[task.task_id]
        winners = [(s.session_id, _replies(s)) for s in group if s.session_id in solved]
        expert = demonstration_replies(demo, run.system, cfg.rollout.max_tool_chars, policy.tool_format)
        winners.append((demo.session_id, expert))
        losers = [s for s in group if s.session_id not in solved]
        for session_id, feedback in outcome_preferences(winners, losers):
            run.store.append(session_id, FeedbackAdded(feedback=feedback))
            written += 1
    run.log.write(
        "pairs", 0, {"tasks": len(tasks), "episodes": len(ran), "solved": len(solved), "pairs": written}
    )
    return written


def _replies(session: Session) -> list[Reply]:
    return [Reply(call.messages, call.response) for call in session.llm_calls]


def train_dpo(config: RunConfig, *, console: Console | None = None) -> TrainResult:
    """`trainer: dpo`: imitation, outcome pairs, DPO; `dpo_policy/` and `sft_policy/` are then evaluated
    on the report split."""
    console = console or Console()
    section = config.dpo
    if section is None:
        raise ValueError("trainer dpo needs a `dpo:` section")
    with start_run(config, resume=False) as run:
        demos = imitation(run, console, resume=False)
        sample_pairs(run, section, demos)
        preferences = stored_preferences(run.store)
        if not preferences:
            raise ValueError(
                "DPO found no preference pair: the imitation policy's episodes never parted from a solved"
                " one; sample more episodes (dpo.episodes_per_task) or more tasks (dpo.tasks)"
            )
        policy: HFPolicy = run.need_policy()
        trainer = DPOTrainer(policy, section.trainer)
        for log in trainer.fit(preferences):
            run.log.write("dpo", log.step, {"loss": log.loss, "margin": log.margin, "accuracy": log.accuracy})
        run.state = dataclasses.replace(run.state, stage=Stage.DPO, policy_version=policy.version)
        export_policy(policy, run.folder / "dpo_policy")
        report = evaluate_exported(run, config.evaluation.split, config.evaluation.tasks)
        return TrainResult(run.state.stage, None, (), report)


__all__ = ["ANNOTATOR", "outcome_preferences", "parting", "sample_pairs", "train_dpo"]
