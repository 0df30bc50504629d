"""How the OTLP receiver groups spans into sessions and when it finishes them (`ServiceConfig.traces`).

Read from the environment when not given: `SESSIONRL_TRACES_GROUP_BY` (an attribute name),
`SESSIONRL_TRACES_IDLE_S` and `SESSIONRL_TRACES_ROOT_GRACE_S` (seconds), so `sessionrl serve` takes them
without new flags.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

GROUP_BY_ENV = "SESSIONRL_TRACES_GROUP_BY"
IDLE_ENV = "SESSIONRL_TRACES_IDLE_S"
GRACE_ENV = "SESSIONRL_TRACES_ROOT_GRACE_S"


class TracesConfig(BaseModel):
    """Grouping and finishing of the sessions `POST /v1/traces` assembles."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group_by: str | None = Field(
        default=None,
        description="A span attribute whose value names the session (session.id, gen_ai.conversation.id);"
        " none: one session per trace. Spans without it join the session of their trace.",
    )
    root_grace_s: float = Field(
        default=1.0,
        ge=0,
        description="After the root span came, how long to wait for spans of the session still on their"
        " way (an exporter's batches may arrive out of order) before finishing it; 0: at once.",
    )
    idle_finish_s: float = Field(
        default=300.0,
        gt=0,
        description="A session whose root span never came is finished this long after its last span.",
    )

    @classmethod
    def from_env(cls) -> TracesConfig:
        """The config the environment gives (see the module's docstring)."""
        fields: dict[str, object] = {}
        if os.environ.get(GROUP_BY_ENV):
            fields["group_by"] = os.environ[GROUP_BY_ENV]
        if os.environ.get(IDLE_ENV):
            fields["idle_finish_s"] = os.environ[IDLE_ENV]
        if os.environ.get(GRACE_ENV):
            fields["root_grace_s"] = os.environ[GRACE_ENV]
        return cls.model_validate(fields)
