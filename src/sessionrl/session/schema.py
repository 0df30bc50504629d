"""Schema registry: every stored session document carries its schema version.

Reading an old document migrates it to the current view through a chain of small pure functions,
one per version step. JSON Schema is exported for every version.

>>> migrate({"schema_version": 1, "plan": {"root_goal": "g", "subgoals": ["a"]}})["plan"]["subgoals"]
[{'id': 'g1', 'description': 'a', 'tool': None, 'depends_on': []}]
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict

from sessionrl.errors import InvalidEvent
from sessionrl.session.model import SCHEMA_VERSION, Session

Doc = dict[str, Any]


class PlanV1(BaseModel):
    """Version 1 plan: sub-goals were a flat list of descriptions."""

    model_config = ConfigDict(extra="forbid")
    root_goal: str
    subgoals: list[str] = []


class SessionV1(Session):
    """Version 1 of the session document (only the plan differs from version 2)."""

    schema_version: int = 1
    plan: PlanV1 | None = None  # type: ignore[assignment]


def plan_v1_to_v2(plan: Doc) -> Doc:
    """Turn a v1 plan (sub-goals as strings) into v2 sub-goal objects, keeping order and text."""
    subgoals = [
        {"id": f"g{i}", "description": text, "tool": None, "depends_on": []}
        for i, text in enumerate(plan.get("subgoals", []), start=1)
    ]
    return {**plan, "subgoals": subgoals}


def v1_to_v2(doc: Doc) -> Doc:
    """Migrate a whole v1 session document to v2."""
    out = {**doc, "schema_version": 2}
    if doc.get("plan") is not None:
        out["plan"] = plan_v1_to_v2(doc["plan"])
    return out


MIGRATIONS: dict[int, Callable[[Doc], Doc]] = {1: v1_to_v2}
"""`MIGRATIONS[v]` turns a version-`v` document into a version-`v+1` one."""

MODELS: dict[int, type[BaseModel]] = {1: SessionV1, 2: Session}
"""The read model of every schema version."""


def migrate(doc: Doc) -> Doc:
    """Bring a session document of any known version up to the current one. The input is not changed: an
    older document is migrated in a copy, and a current one is returned as it is (nothing to copy)."""
    version = doc.get("schema_version", 1)
    if not isinstance(version, int) or version not in MODELS:
        raise InvalidEvent("schema_version", f"unknown schema version {version!r}; known: {sorted(MODELS)}")
    if version == SCHEMA_VERSION:
        return doc
    out = copy.deepcopy(doc)
    while version < SCHEMA_VERSION:
        out = MIGRATIONS[version](out)
        version += 1
    return out


def load_session(doc: Doc) -> Session:
    """Validate a stored document of any version as the current `Session` view."""
    return Session.model_validate(migrate(doc))


def export_schemas(out_dir: Path) -> list[Path]:
    """Write `session.v{N}.schema.json` for every known version; return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for version, model in sorted(MODELS.items()):
        path = out_dir / f"session.v{version}.schema.json"
        schema = model.model_json_schema()
        schema["$id"] = f"sessionrl/session.v{version}.schema.json"
        path.write_bytes(orjson.dumps(schema, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        paths.append(path)
    return paths
