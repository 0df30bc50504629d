"""The dashboard's operations page: the registry's policy versions with their stages and lineage, the
strategy mode, the sessions waiting for a person, and the operations log (stage changes, canary checks,
loop decisions, alerts), newest first."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from sessionrl.access import Principal
from sessionrl.ops.registry import PolicyRegistry, PolicyVersion
from sessionrl.ops.strategy import current_mode
from sessionrl.ops.takeover import NEEDS_HUMAN
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.ui.auth import viewer
from sessionrl.ui.runs import run_names
from sessionrl.ui.sessions import page

router = APIRouter(prefix="/ui", include_in_schema=False)
Viewer = Annotated[Principal, Depends(viewer)]
LOG_LINES = 200
"""Most log lines the page shows."""


@router.get("/policies")
def policies_page(
    request: Request, who: Viewer, kind: Annotated[str | None, Query(max_length=64)] = None
) -> Response:
    """Versions, the strategy mode, parked sessions and the operations log (of one kind, if asked)."""
    store = request.app.state.store
    assert isinstance(store, SessionStore)
    registry = PolicyRegistry(store)
    log = registry.log(kind=kind or None)
    parked = store.query(SessionQuery(tags=(NEEDS_HUMAN,), limit=100))
    versions = registry.versions()
    context = {
        "who": who,
        "nav": "policies",
        "versions": versions,
        "runs": version_runs(versions, request.app.state.ui.config.runs_dir),
        "mode": current_mode(registry).value,
        "parked": parked,
        "log": list(reversed(log[-LOG_LINES:])),
        "kind": kind or "",
        "kinds": [
            "stage",
            "rolled_back",
            "canary_check",
            "loop",
            "alert",
            "setting",
            "resumed",
            "registered",
        ],
    }
    return page(request, "policies.html", context)


def version_runs(versions: list[PolicyVersion], runs_dir: Path) -> dict[tuple[str, int], str]:
    """The dashboard's run (a folder under `runs_dir`) each version was trained in, by (policy, version):
    the page links it, and versions ticked together are compared through their runs."""
    known = set(run_names(runs_dir))
    out = {}
    for v in versions:
        name = Path(v.lineage.run_dir).name if v.lineage.run_dir else None
        if name in known:
            out[(v.policy, v.version)] = name
    return out
