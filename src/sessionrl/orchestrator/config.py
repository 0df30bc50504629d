"""Configuration of the orchestrator: guard limits, lane sizes, cache and commit batching."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LaneConfig(BaseModel):
    """One lane: how many steps of a kind run at once, and how many may wait for a slot."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    concurrency: int = Field(default=64, ge=1, description="Steps of this kind running at the same time.")
    max_waiting: int = Field(
        default=4096, ge=0, description="Steps allowed to wait for a slot; one more is refused as overloaded."
    )


class OrchestratorConfig(BaseModel):
    """Everything the engine and its guards are tuned by. Defaults suit one process on a laptop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_subgoals: int = Field(default=10, ge=1, description="A plan with more sub-goals is rejected.")
    forbidden_tools: frozenset[str] = Field(
        default=frozenset(), description="Tools a plan may never name, even when a skill of that name exists."
    )
    repeated_tools: bool = Field(
        default=False, description="Accept a plan naming one tool in several sub-goals (reading two orders)."
    )
    free_form_tools: bool = Field(
        default=False,
        description="Record tool calls the agent made with tools no skill describes, in every session "
        "(a session allows them for itself with metadata free_form_tools: true).",
    )
    hallucination_penalty: float = Field(
        default=-2.0, description="Score of the feedback given at finish to a sub-goal no tool call executed."
    )
    plan_lane: LaneConfig = Field(default_factory=LaneConfig, description="Plan steps (policy calls).")
    tool_lane: LaneConfig = Field(
        default_factory=lambda: LaneConfig(concurrency=1024, max_waiting=8192),
        description="Tool steps; wide, because tools mostly wait on I/O.",
    )
    llm_lane: LaneConfig = Field(default_factory=LaneConfig, description="LLM steps (policy calls).")
    cache_size: int = Field(default=10_000, ge=1, description="Active sessions kept in memory (LRU).")
    commit_batch: int = Field(
        default=256, ge=1, description="Most events written in one store transaction (group commit)."
    )
    commit_gather_s: float = Field(
        default=0.002,
        ge=0.0,
        description="Longest a transaction waits for the steps on their way to the committer to join it.",
    )
    commit_retries: int = Field(
        default=5, ge=1, description="Attempts to commit a step whose session changed under it meanwhile."
    )
