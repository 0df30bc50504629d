"""Schema registry: old documents migrate to the current view; every version exports a JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.errors import InvalidEvent
from sessionrl.session import SCHEMA_VERSION, SessionCreate, apply, created, load_session, migrate
from sessionrl.session.codec import digest, dumps


def v1_document() -> dict:
    session = apply(None, created(SessionCreate(user_query="refund please", tags=("vip",))))
    doc = json.loads(dumps(session))
    doc["schema_version"] = 1
    doc["plan"] = {"root_goal": "refund", "subgoals": ["check inventory", "send sms", "trigger refund"]}
    return doc


def test_v1_document_reads_as_v2_view() -> None:
    doc = v1_document()
    session = load_session(doc)
    assert session.schema_version == SCHEMA_VERSION == 2
    assert session.plan is not None
    assert [g.description for g in session.plan.subgoals] == ["check inventory", "send sms", "trigger refund"]
    assert [g.id for g in session.plan.subgoals] == ["g1", "g2", "g3"]
    assert session.tags == ("vip",)
    assert doc["schema_version"] == 1, "migration must not change its input"


def test_current_documents_pass_through_unchanged() -> None:
    session = load_session(v1_document())
    assert load_session(json.loads(dumps(session))) == session
    assert digest(load_session(migrate(json.loads(dumps(session))))) == digest(session)
    current = json.loads(dumps(session))
    assert migrate(current) is current  # nothing to migrate: no copy is made


def test_unknown_version_is_a_clear_error() -> None:
    with pytest.raises(InvalidEvent, match=r"unknown schema version 9; known: \[1, 2\]"):
        migrate({"schema_version": 9})


def test_schema_export_writes_every_version(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["schema", "export", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    v1 = json.loads((tmp_path / "session.v1.schema.json").read_text())
    v2 = json.loads((tmp_path / "session.v2.schema.json").read_text())
    assert v1["$defs"]["PlanV1"]["properties"]["subgoals"]["items"] == {"type": "string"}
    assert "SubGoal" in v2["$defs"]
    assert v2["properties"]["schema_version"]["default"] == 2
