"""Configuration of the HTTP service: where the store is, who may call it, and how much.

Tokens come from the config or from the environment: `SESSIONRL_TOKENS="tok1:read,write;tok2:read"`, or
`SESSIONRL_TOKENS_FILE`, a file of such entries (one per line or `;`-separated; `#` starts a comment). Several
`serve` processes behind one balancer must accept the same tokens: give them all the same variable or file
(`shared_tokens` creates a missing file with one new token, so the first process to start makes it and the
others read it).

>>> sorted(scope.value for scope in parse_tokens("tok1:read,write;tok2:read")["tok1"])
['read', 'write']
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sessionrl.access import Scope
from sessionrl.capture.otlp_config import TracesConfig
from sessionrl.gateway.config import GatewayConfig
from sessionrl.ops.config import OpsConfig
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.service.collector import FULL_GC_EVERY_S

TOKENS_ENV = "SESSIONRL_TOKENS"
TOKENS_FILE_ENV = "SESSIONRL_TOKENS_FILE"


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


def read_tokens_file(path: Path) -> dict[str, frozenset[Scope]]:
    """The tokens in a file of `token:scopes` entries (see the module doc); `ValueError` when it holds
    none or an entry is malformed, naming the file."""
    lines = (line.partition("#")[0] for line in path.read_text(encoding="utf-8").splitlines())
    try:
        tokens = parse_tokens(";".join(lines))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not tokens:
        raise ValueError(f"{path} holds no token (expected lines like token:read,write)")
    return tokens


def shared_tokens(path: Path) -> tuple[dict[str, frozenset[Scope]], bool]:
    """The tokens of `path`, and whether this call created it: a file that does not exist yet is made,
    readable by its owner alone, with one new read-write token. It appears whole (written aside, then
    linked into place), so processes starting together all read the same token, whichever made it."""
    if path.exists():
        return read_tokens_file(path), False
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("# sessionrl serve tokens (token:scopes, one per line)\n")
            out.write(f"{secrets.token_urlsafe(24)}:read,write\n")
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(aside, path)
            created = True
        except FileExistsError:  # another process made it first: use its token
            created = False
    finally:
        aside.unlink()
    return read_tokens_file(path), created


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
    rate_burst: int | None = Field(
        default=None,
        ge=1,
        description="Requests a token may make at once after a pause (none: twice the rate).",
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
    gateway: GatewayConfig = Field(
        default_factory=GatewayConfig, description="How the gateway ends the sessions it captures."
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

    @property
    def burst(self) -> int:
        """`rate_burst`, or twice the rate when it is not set."""
        return self.rate_burst if self.rate_burst is not None else max(1, int(self.rate_per_s * 2))

    @classmethod
    def from_env(cls, **fields: object) -> ServiceConfig:
        """A config whose tokens (when not given in `fields`) are read from `SESSIONRL_TOKENS`, else from
        the file `SESSIONRL_TOKENS_FILE` names."""
        if "tokens" not in fields and os.environ.get(TOKENS_ENV):
            fields["tokens"] = parse_tokens(os.environ[TOKENS_ENV])
        elif "tokens" not in fields and os.environ.get(TOKENS_FILE_ENV):
            fields["tokens"] = read_tokens_file(Path(os.environ[TOKENS_FILE_ENV]))
        return cls.model_validate(fields)
