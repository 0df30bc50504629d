"""Configuration of the HTTP service: where the store is, who may call it, and how much.

Tokens come from the config or from the environment (`SESSIONRL_TOKENS="tok1:read,write;tok2:read"`).

>>> sorted(scope.value for scope in parse_tokens("tok1:read,write;tok2:read")["tok1"])
['read', 'write']
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sessionrl.access import Scope
from sessionrl.capture.otlp_config import TracesConfig
from sessionrl.ops.config import OpsConfig
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.service.collector import FULL_GC_EVERY_S

TOKENS_ENV = "SESSIONRL_TOKENS"


def parse_tokens(text: str) -> dict[str, frozenset[Scope]]:
    """Parse `token:scope,scope;token:scope`; raise `ValueError` naming the bad entry."""
    tokens: dict[str, frozenset[Scope]] = {}
    for entry in filter(None, (part.strip() for part in text.split(";"))):
        token, sep, scopes = entry.partition(":")
        if not sep or not token or not scopes:
            raise ValueError(f"token entry {entry[:8]!r}... must look like token:read,write")
        try:
            tokens[token] = frozenset(Scope(s.strip()) for s in scopes.split(",") if s.strip())
        except ValueError:
            raise ValueError(
                f"token entry {entry[:8]!r}...: scopes are read and write, got {scopes!r}"
            ) from None
    return tokens


class ServiceConfig(BaseModel):
    """Everything `create_app` needs besides the skills and policy backends."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    db_url: str = Field(
        default="sqlite:///runs/sessions.db", description="Session store URL (the CLI's default store)."
    )
    tokens: dict[str, frozenset[Scope]] = Field(
        default_factory=dict, description="Bearer tokens and their scopes; requests without one get 401."
    )
    max_body_bytes: int = Field(default=1 << 20, ge=1024, description="Larger request bodies get 413.")
    rate_per_s: float = Field(default=2000.0, gt=0, description="Requests per second allowed per token.")
    rate_burst: int = Field(
        default=4000, ge=1, description="Requests a token may make at once after a pause."
    )
    skills_dir: Path | None = Field(
        default=None, description="Folder of YAML contracts served as simulated skills (when none are given)."
    )
    time_factor: float = Field(default=1.0, gt=0, description="Wall seconds per simulated skill second.")
    full_gc_every_s: float = Field(
        default=FULL_GC_EVERY_S,
        gt=0,
        description="Seconds between full garbage collections; in between, collections skip what survived "
        "one (see `sessionrl.service.collector`).",
    )
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    ops: OpsConfig = Field(
        default_factory=OpsConfig, description="Policy routing, canary rules, alerts (`sessionrl.ops`)."
    )
    upstream_url: str | None = Field(
        default=None,
        description="An OpenAI-compatible server (such as https://host/v1) the gateway proxies to; "
        "none: the gateway answers with the service's own policy.",
    )
    upstream_api_key: str | None = Field(
        default=None, repr=False, description="The key the gateway sends to the upstream server."
    )
    traces: TracesConfig = Field(
        default_factory=TracesConfig.from_env,
        description="How POST /v1/traces groups spans into sessions and finishes them (`sessionrl.capture`).",
    )

    @field_validator("tokens")
    @classmethod
    def _no_empty_token(cls, tokens: dict[str, frozenset[Scope]]) -> dict[str, frozenset[Scope]]:
        if any(not t for t in tokens):
            raise ValueError("a token may not be empty")
        return tokens

    @classmethod
    def from_env(cls, **fields: object) -> ServiceConfig:
        """A config whose tokens (when not given in `fields`) are read from `SESSIONRL_TOKENS`."""
        if "tokens" not in fields and os.environ.get(TOKENS_ENV):
            fields["tokens"] = parse_tokens(os.environ[TOKENS_ENV])
        return cls.model_validate(fields)
