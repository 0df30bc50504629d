"""Alerts: a JSON POST to the configured webhook, and a line in the operations log whatever happens.

An alert that cannot be delivered (no webhook, a refused connection, an error status) is not lost: its
log line says so (`delivered: false` with the reason), and `sessionrl policies log --kind alert` shows it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx

from sessionrl.ops.registry import PolicyRegistry

LOG = logging.getLogger(__name__)


def send_alert(
    registry: PolicyRegistry,
    url: str | None,
    event: str,
    detail: Mapping[str, Any],
    *,
    timeout_s: float = 2.0,
    policy: str | None = None,
    version: int | None = None,
) -> bool:
    """POST `{"event": ..., **detail}` to `url` and log the alert; return whether the webhook took it."""
    body = {"event": event, **detail}
    delivered, problem = False, "no webhook configured"
    if url is not None:
        try:
            answer = httpx.post(url, json=body, timeout=timeout_s)
            delivered = answer.is_success
            problem = "" if delivered else f"webhook answered {answer.status_code}"
        except httpx.HTTPError as exc:
            problem = f"webhook unreachable: {exc}"
    if not delivered:
        LOG.warning("alert %s not delivered (%s): %s", event, problem, body)
    registry.record(
        "alert", {**body, "delivered": delivered, "problem": problem}, policy=policy, version=version
    )
    return delivered
