"""The canary check: compare the canary with production on the sessions each served since the canary
started, then roll it back, promote it, or wait, by the configured rules; every check is logged.

A check waits until each arm has `min_sessions` judged sessions (a `task_outcome` verdict). Then the
rollback rule is evaluated first: when it holds, the canary is rolled back (routing to it stops at once),
the rollback is logged and an alert goes to the webhook. Otherwise, when the promotion rule holds, the
canary goes to production. `sessionrl loop` runs a check every cycle; `sessionrl policies check` runs one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sessionrl.episodes.verdict import task_success
from sessionrl.ops.alerts import send_alert
from sessionrl.ops.analysis import Comparison, compare_sessions, served_sessions
from sessionrl.ops.config import OpsConfig
from sessionrl.ops.registry import PolicyRegistry, Stage
from sessionrl.ops.rules import holds


class Action:
    """What a canary check decided."""

    WAIT = "wait"
    HOLD = "hold"
    ROLLBACK = "rollback"
    PROMOTE = "promote"


@dataclass(frozen=True)
class Verdict:
    """One canary check: the decision, why, the sample sizes, and the comparison it rests on."""

    policy: str
    production: int
    canary: int
    action: str
    reason: str
    judged: tuple[int, int]
    comparison: Comparison

    def summary(self) -> dict[str, Any]:
        """What the operations log keeps of the check."""
        return {
            "production": self.production,
            "canary": self.canary,
            "action": self.action,
            "reason": self.reason,
            "judged_production": self.judged[0],
            "judged_canary": self.judged[1],
            "sessions_production": self.comparison.n_a,
            "sessions_canary": self.comparison.n_b,
            "variables": {k: round(v, 6) for k, v in self.comparison.variables().items()},
        }


def check_canary(registry: PolicyRegistry, config: OpsConfig) -> Verdict | None:
    """Check the canary of `config.policy` (None when there is no canary or no production) and act."""
    policy = config.policy
    canary, production = registry.canary(policy), registry.production(policy)
    if canary is None or production is None:
        return None
    store, since = registry.store, canary.updated_at
    first = served_sessions(store, policy, production.version, since=since)
    second = served_sessions(store, policy, canary.version, since=since)
    comparison = compare_sessions(policy, production.version, canary.version, first, second)
    judged = (_judged(first), _judged(second))
    values = comparison.variables()
    rules = config.canary
    if min(judged) < rules.min_sessions:
        action, reason = Action.WAIT, f"each arm needs {rules.min_sessions} judged sessions, has {judged}"
    elif holds(rules.rollback_when, values):
        action, reason = Action.ROLLBACK, f"breach: {rules.rollback_when}"
    elif rules.promote_when is not None and holds(rules.promote_when, values):
        action, reason = Action.PROMOTE, f"better: {rules.promote_when}"
    else:
        action, reason = Action.HOLD, "no rule holds yet"
    verdict = Verdict(policy, production.version, canary.version, action, reason, judged, comparison)
    registry.record("canary_check", verdict.summary(), policy=policy, version=canary.version)
    _act(registry, config, verdict)
    return verdict


def _act(registry: PolicyRegistry, config: OpsConfig, verdict: Verdict) -> None:
    if verdict.action == Action.ROLLBACK:
        registry.rollback(verdict.policy, reason=verdict.reason)
        send_alert(
            registry,
            config.webhook_url,
            "canary_rolled_back",
            verdict.summary(),
            timeout_s=config.webhook_timeout_s,
            policy=verdict.policy,
            version=verdict.canary,
        )
    elif verdict.action == Action.PROMOTE:
        registry.promote(verdict.policy, verdict.canary, Stage.PRODUCTION, reason=verdict.reason)
        registry.set_evaluation(
            verdict.policy, verdict.canary, {"canary": verdict.comparison.model_dump(mode="json")}
        )


def _judged(sessions: Any) -> int:
    return sum(task_success(s) is not None for s in sessions)
