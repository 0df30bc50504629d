"""The reward page says how its totals are made, and warns when a version was scored while the layer
normaliser had seen few sessions; a 4/5 rating is worth about the same whenever the normaliser started."""

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


def test_the_same_rating_is_worth_about_the_same_whenever_the_normaliser_started(db: str) -> None:
    with SessionStore.open(db) as store:
        engine = RewardEngine()
        for session_id in ("first", "plain-1", "plain-2", "later"):
            engine.score_and_store(store, session_id)
        # nothing seen yet: centre 0, scale 1, so the rule's (4 - 3) / 2 = 0.5 as is
        assert experience(store, "first") == pytest.approx(0.5)
        # seen 0.5, 0, 0: mean 1/6, centred on 3 · (1/6) / (3 + 10); σ = 0.24 is below the floor of 1
        assert experience(store, "later") == pytest.approx(0.5 - 0.5 / 13)
        # after two unrated sessions alone (no spread): still 0.5, where the floor of 0.1 made it 0.5 / 0.1
        fresh = RewardEngine()
        for session_id in ("plain-1", "plain-2"):
            fresh.score(store.get(session_id))
        assert fresh.score(store.get("later")).layers["experience"].normalised == pytest.approx(0.5)


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
