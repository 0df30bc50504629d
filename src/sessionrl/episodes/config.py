"""How episodes run: a run's episode settings, and the engine guards a batch of scripted plans needs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sessionrl.envs.base import ExpertPlan
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.skills import ExecutorConfig


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    """How episodes are run."""

    max_steps: int = field(default=8, metadata={"help": "policy calls per episode before it is cut off"})
    concurrency: int = field(default=32, metadata={"help": "episodes in flight at once"})
    max_tool_chars: int = field(default=400, metadata={"help": "a tool message is cut to this length"})
    full_schemas: bool = field(
        default=True, metadata={"help": "show each tool's whole JSON schema; false: names and parameters"}
    )
    domain_policy: bool = field(
        default=True, metadata={"help": "open the system prompt with the domain's policy text"}
    )
    max_invalid: int = field(
        default=2, metadata={"help": "consecutive replies that are not actions before the episode ends"}
    )
    expert_retries: int = field(
        default=2, metadata={"help": "times a scripted plan calls a step again after a retryable failure"}
    )
    executor: ExecutorConfig = field(
        default_factory=ExecutorConfig, metadata={"help": "retries and back-off of every episode's executor"}
    )

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.concurrency < 1 or self.max_tool_chars < 16 or self.max_invalid < 1:
            raise ValueError(
                "RolloutConfig needs max_steps, concurrency and max_invalid >= 1 and max_tool_chars >= 16"
            )
        if self.expert_retries < 0:
            raise ValueError(f"RolloutConfig.expert_retries must be >= 0, got {self.expert_retries}")


def guards_for_plans(base: OrchestratorConfig, plans: Iterable[ExpertPlan]) -> OrchestratorConfig:
    """`base` with the plan guards widened to let `plans` through: the sub-goal limit raised to the longest
    plan, and one tool allowed in several sub-goals (an expert reads two orders with one tool).

    A scripted plan is as long as its task needs; the guards exist to stop a policy's runaway plans, not
    a demonstration. The other settings (lanes, forbidden tools, commit batching) stay as `base` says.

    >>> plans = [ExpertPlan("g", (), "done")]
    >>> guards_for_plans(OrchestratorConfig(max_subgoals=4), plans).max_subgoals
    4
    """
    longest = max((len(plan.steps) for plan in plans), default=0)
    widened = {"max_subgoals": max(base.max_subgoals, longest), "repeated_tools": True}
    return base.model_copy(update=widened)
