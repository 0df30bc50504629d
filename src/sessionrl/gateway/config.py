"""The gateway's settings (`ServiceConfig.gateway`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GatewayConfig(BaseModel):
    """How the gateway ends the sessions it captures (`sessionrl.gateway.ending`), and what it asks an
    upstream."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    finish_on_answer: bool = Field(
        default=True,
        description="Finish a session when the model answers without a tool call (its text is the output); "
        "an agent that goes on talking after a text answer turns this off and calls finish itself.",
    )
    idle_finish_s: float | None = Field(
        default=900.0, gt=0, description="Finish a session no request has reached for this long; none: never."
    )
    sweep_every_s: float = Field(default=30.0, gt=0, description="How often idle sessions are looked for.")
    sweep_projection_rows: int = Field(
        default=500,
        ge=1,
        description="Outbox rows a sweep projects into the query tables before it looks (not the whole "
        "backlog, which would stall the requests being served); sessions past them are found once a query "
        "or later sweeps have projected them.",
    )
    upstream_token_ids: bool = Field(
        default=False,
        description="Ask the upstream for the sampled token ids and log-probabilities (vLLM's OpenAI server "
        "gives them) and record them, so training uses them as sampled; off: the session's tokens are "
        "re-tokenised from its text.",
    )
