"""Episodes: any agent attempts one task as one Decision Session, through the orchestrator into the store.

One driver (`run_episode`, `run_episodes`) runs every kind of agent: a scripted plan (`scripted.expert`,
`scripted.gold`), a language-model policy (`sessionrl.episodes.llm.PolicyAgent`, which imports torch, so
it is imported from its module) and, in research code, a structured one (bench/research/structured_agent.py).
Every session opens with the same metadata (`metadata`), ends with the same verdict (`verdict`),
and an unsolved one says why (`why_unsolved`); `Tally` counts the demonstrations a batch failed to give.
"""

from sessionrl.envs.base import entities_named
from sessionrl.episodes.batch import RunSummary, run_many
from sessionrl.episodes.config import RolloutConfig, guards_for_plans
from sessionrl.episodes.driver import Agent, Attempt, EpisodeSpec, Ran, run_episode, run_episodes, settle
from sessionrl.episodes.metadata import expected_entities, session_create
from sessionrl.episodes.progress import Bar, progress
from sessionrl.episodes.scripted import NoGoldPlans, ScriptedAgent, expert, gold, session_plan
from sessionrl.episodes.skills import EpisodeSkills
from sessionrl.episodes.tally import MAX_MISSING, MissingDemonstrations, Tally, require
from sessionrl.episodes.verdict import verdict, why_unsolved

__all__ = [
    "MAX_MISSING",
    "Agent",
    "Attempt",
    "Bar",
    "EpisodeSkills",
    "EpisodeSpec",
    "MissingDemonstrations",
    "NoGoldPlans",
    "Ran",
    "RolloutConfig",
    "RunSummary",
    "ScriptedAgent",
    "Tally",
    "entities_named",
    "expected_entities",
    "expert",
    "gold",
    "guards_for_plans",
    "progress",
    "require",
    "run_episode",
    "run_episodes",
    "run_many",
    "session_create",
    "session_plan",
    "settle",
    "verdict",
    "why_unsolved",
]
