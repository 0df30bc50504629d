"""The reward page says how its totals are made, and warns when a version was scored before the layer
normaliser had settled: why a 4/5 rating was worth +0.55 in one session and about +5 in another."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from ui_support import READER, TOKENS

from sessionrl.rewards.engine import RewardEngine
from sessionrl.rewards.vector import RewardVector
from sessionrl.service import parse_tokens
from sessionrl.session import FeedbackAdded
from sessionrl.session.model import Feedback, FeedbackType, SessionCreate
from sessionrl.store import SessionStore
from sessionrl.ui import UIConfig, create_ui_app


def rated(store: SessionStore, session_id: str, score: float | None) -> None:
    store.create(SessionCreate(user_query="where is my order?", session_id=session_id))
    if score is not None:
        store.append(
            session_id, FeedbackAdded(feedback=Feedback(type=FeedbackType.HUMAN_RATING, score=score))
        )


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 's.db'}"
    with SessionStore.open(url) as store:
        for session_id, score in (("first", 4.0), ("plain-1", None), ("plain-2", None), ("later", 4.0)):
            rated(store, session_id, score)
    return url


def experience(store: SessionStore, session_id: str) -> float:
    vector = RewardVector.model_validate(store.reward(session_id).vector)
    return vector.layers["experience"].contribution


def test_the_same_rating_is_worth_what_the_normaliser_had_seen(db: str) -> None:
    with SessionStore.open(db) as store:
        engine = RewardEngine()
        for session_id in ("first", "plain-1", "plain-2", "later"):
            engine.score_and_store(store, session_id)
        # nothing seen yet: the raw (4 - 1) / 4 = 0.75 passes through
        assert experience(store, "first") == pytest.approx(0.75)
        # seen 0.75, 0, 0: mean 0.25, σ = sqrt(((0.5)² + 2 · (0.25)²) / 3) = 0.3536; (0.75 - 0.25) / 0.3536
        assert experience(store, "later") == pytest.approx(0.5 / (0.375 / 3) ** 0.5)
        # after two unrated sessions alone, a layer that never moved has the floor scale: 0.75 / 0.1, clipped
        fresh = RewardEngine()
        for session_id in ("plain-1", "plain-2"):
            fresh.score(store.get(session_id))
        assert fresh.score(store.get("later")).layers["experience"].normalised == 5.0


def test_the_reward_page_shows_the_sums_and_warns_of_an_unsettled_normaliser(db: str, tmp_path: Path) -> None:
    with SessionStore.open(db) as store:
        engine = RewardEngine()
        for session_id in ("first", "plain-1", "plain-2", "later"):
            engine.score_and_store(store, session_id)
        later = RewardVector.model_validate(store.reward("later").vector)
    app = create_ui_app(db, UIConfig(runs_dir=tmp_path / "runs"), parse_tokens(TOKENS))
    with TestClient(app) as client:
        client.post("/ui/login", data={"token": READER})
        page = client.get("/ui/sessions/later/rewards/1").text
    session_line = re.search(r'data-check="session">(.*?)</p>', page, re.S)
    assert session_line is not None
    shown = [float(x) for x in re.findall(r"([+-]\d+\.\d+) \(\w+\)", session_line.group(1))]
    assert len(shown) == 4  # completion, efficiency, risk, experience; long_term is apart
    assert sum(shown) == pytest.approx(later.session_reward, abs=2e-3)
    assert f"<b>{later.long_term_reward:+.4f}</b>" in page
    assert 'data-warmup="3"' in page  # scored when the normaliser had seen three sessions
