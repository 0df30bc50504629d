"""Per-turn tool accuracy of a run's policy (`sessionrl.eval.tool_accuracy`) on held-out tasks.

The gold trajectories are the expert's episodes on the first tasks of the evaluation split, without
faults, recorded once in the run's store (sessions `gold-<split>-<task id>`, stage `gold`) and read back
by every later measurement. They are rendered as the replies the policy should write, in its own
tool-call format (`demonstration_replies`, as imitation renders its demonstrations), and the policy
answers each turn greedily. A task the expert did not solve has no gold trajectory; it is counted as
missing.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from sessionrl.envs.base import Split, stream_seed
from sessionrl.episodes import EpisodeSpec, expert, run_episodes
from sessionrl.eval.tool_accuracy import ToolAccuracy, tool_accuracy
from sessionrl.orchestrator.policy import PolicyError
from sessionrl.policy.llm import HFPolicy
from sessionrl.session.model import Message, Session
from sessionrl.train.llm.data import Reply, demonstration_replies
from sessionrl.train.llm.run import Run, evaluation_view

GOLD_SEED_BITS = 31


def gold_sessions(run: Run, split: Split, n_tasks: int) -> tuple[list[Session], int]:
    """The expert's episodes on the first `n_tasks` of `split` (recorded once), the solved ones, and how
    many were not solved."""
    tasks = run.env.tasks(split)[:n_tasks]
    specs = [
        EpisodeSpec(
            task=task,
            session_id=f"gold-{split}-{task.task_id}",
            seed=stream_seed(run.config.seed, "gold", task.task_id, bits=GOLD_SEED_BITS),
            metadata={"stage": "gold", "split": str(split)},
        )
        for task in tasks
    ]
    batch = run_episodes(
        run.env, specs, expert(run.env), run.store, run.config.rollout, orchestrator=run.config.orchestrator
    )
    ran = asyncio.run(batch)
    solved = [run.store.get(r.session_id) for r in ran if r.success]
    return solved, len(ran) - len(solved)


def gold_replies(run: Run, policy: HFPolicy, sessions: Sequence[Session]) -> dict[str, list[Reply]]:
    """Each gold session as the replies `policy` should write (after the system prompt in its tool-call
    format), by task id."""
    system, max_chars = run.system_in(policy.tool_format), run.config.rollout.max_tool_chars
    return {
        str(s.metadata["task_id"]): demonstration_replies(s, system, max_chars, policy.tool_format)
        for s in sessions
    }


def measure_tool_accuracy(run: Run, policy: HFPolicy, split: Split, n_tasks: int) -> ToolAccuracy:
    """`policy`'s per-turn tool accuracy on the first `n_tasks` of `split`, answering greedily with at
    most `evaluation.max_new_tokens` tokens a reply."""
    sessions, missing = gold_sessions(run, split, n_tasks)
    view = evaluation_view(policy, run.config.evaluation.max_new_tokens)
    unanswered = 0

    def answer(conversations: Sequence[Sequence[Message]]) -> list[str]:
        nonlocal unanswered
        fits = [i for i, c in enumerate(conversations) if takes(view, c)]
        unanswered += len(conversations) - len(fits)
        texts = [""] * len(conversations)  # an empty reply does not parse, as in an episode
        replies = view.generate_now([conversations[i] for i in fits]) if fits else []
        for i, reply in zip(fits, replies, strict=True):
            texts[i] = reply.text
        return texts

    replies = gold_replies(run, policy, sessions)
    measured = tool_accuracy(
        replies, policy.tool_format, answer, batch=policy.batching.max_batch, missing=missing
    )
    return dataclasses.replace(measured, unanswered=unanswered)


def takes(policy: HFPolicy, conversation: Sequence[Message]) -> bool:
    """Whether `policy` can take `conversation` as a prompt (not too long even without its history)."""
    try:
        policy.encode_prompt(conversation)
    except PolicyError:
        return False
    return True


__all__ = ["gold_replies", "gold_sessions", "measure_tool_accuracy", "takes"]
