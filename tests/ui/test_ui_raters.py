"""The session page shows every rater's rating, each with its source, and an LLM call's unknown usage as
unknown (not 0)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from ui_support import READER, TOKENS

from sessionrl.service import parse_tokens
from sessionrl.session import FeedbackAdded, LLMCall, LLMCallRecorded
from sessionrl.session.model import Feedback, FeedbackType, SessionCreate
from sessionrl.store import SessionStore
from sessionrl.ui import UIConfig, create_ui_app

T0 = datetime(2024, 3, 20, 8, 23, tzinfo=UTC)


def test_each_raters_rating_and_unknown_tokens_are_shown(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    with SessionStore.open(url) as store:
        store.create(SessionCreate(user_query="Hb 85 g/L", session_id="s-two"))
        store.append("s-two", LLMCallRecorded(call=LLMCall(call_id="l1", purpose="chat")))
        for who, score, later in (("doc_007", 4, 0.0), ("doc_012", 2, 2.5)):
            at = T0 + timedelta(hours=later)
            rating = Feedback(type=FeedbackType.HUMAN_RATING, score=score, annotator=who, occurred_at=at)
            store.append("s-two", FeedbackAdded(feedback=rating))
    app = create_ui_app(url, UIConfig(runs_dir=tmp_path / "runs"), parse_tokens(TOKENS))
    with TestClient(app, follow_redirects=False) as client:
        client.post("/ui/login", data={"token": READER})
        page = client.get("/ui/sessions/s-two").text
    assert "<td>doc_007</td>" in page
    assert "<td>doc_012</td>" in page
    assert "tokens unknown" in page
    assert "None tokens" not in page
