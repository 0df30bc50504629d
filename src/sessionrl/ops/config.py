"""Configuration of operations: which policy a service routes, canary rules, alerts, fallback plans, the loop.

```yaml
policy: orders
webhook_url: http://alerts.local/hook
canary: {share: 0.2, min_sessions: 20, rollback_when: "tcsr_drop > 0.005 or dvr_drop > 0.02"}
plan_templates:
  support: [{tool: find_order, params: {}}, {tool: send_sms, params: {}}]
```
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sessionrl.errors import InvalidEvent
from sessionrl.ops.rules import compile_rule


class CanaryConfig(BaseModel):
    """When a canary is judged, and what rolls it back or promotes it (rule expressions: see `ops.rules`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    share: float = Field(default=0.05, gt=0.0, le=1.0, description="Share of sessions a new canary serves.")
    min_sessions: int = Field(
        default=20, ge=1, description="Judged sessions each arm needs before a rule is evaluated."
    )
    rollback_when: str = Field(
        default="tcsr_drop > 0.005 or dvr_drop > 0.02",
        description="Breach rule: when it holds, the canary is rolled back automatically.",
    )
    promote_when: str | None = Field(
        default="success_gain >= 0 and tcsr_gain >= 0",
        description="When it holds (and no breach), the canary goes to production; none: promote by hand.",
    )

    @field_validator("rollback_when", "promote_when")
    @classmethod
    def _compiles(cls, rule: str | None) -> str | None:
        if rule is not None:
            try:
                compile_rule(rule)
            except InvalidEvent as exc:  # pydantic reports ValueErrors
                raise ValueError(exc.rule) from exc
        return rule


class TemplateStep(BaseModel):
    """One step of a configured fallback plan: a tool and its fixed parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)
    description: str = ""


class OpsConfig(BaseModel):
    """What a service needs to route sessions to policy versions, degrade, and alert."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str = Field(default="default", min_length=1, description="Registry policy the service routes.")
    webhook_url: str | None = Field(
        default=None, description="Alerts (rollback, takeover) are POSTed here as JSON; none: logged only."
    )
    webhook_timeout_s: float = Field(default=2.0, gt=0, description="Longest an alert POST may take.")
    canary: CanaryConfig = Field(default_factory=CanaryConfig, description="Canary analysis rules.")
    plan_templates: dict[str, tuple[TemplateStep, ...]] = Field(
        default_factory=dict,
        description="Fallback plans by scenario (`default`: for any other session), for sessions whose"
        " environment has no expert.",
    )
