"""`sessionrl rewards ...` on a store holding ended and running sessions: score and rescore agree on which
to score and say what they skipped; explain says how to get a reward and how each layer was normalised."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.cli.rewards import is_clipped
from sessionrl.rewards.vector import LayerValue, RewardVector
from sessionrl.session import Feedback, FeedbackAdded, FeedbackType, SessionCreate, StateChanged
from sessionrl.store import SessionStore

runner = CliRunner()


def rated(store: SessionStore, session_id: str, score: float, *, finish: bool) -> None:
    """A session rated `score`, finished or still executing."""
    store.create(SessionCreate(user_query="Where is my order?", session_id=session_id))
    store.append(session_id, StateChanged(state="executing"))
    if finish:
        store.append(session_id, StateChanged(state="finished"))
    store.append(session_id, FeedbackAdded(feedback=Feedback(type=FeedbackType.HUMAN_RATING, score=score)))


@pytest.fixture
def db(tmp_path: Path) -> str:
    """Four finished sessions (f0..f3) rated 1, 2, 4, 5, and two still executing (r0, r1)."""
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    with SessionStore.open(url) as store:
        for i, score in enumerate((1.0, 2.0, 4.0, 5.0)):
            rated(store, f"f{i}", score, finish=True)
        rated(store, "r0", 3.0, finish=False)
        rated(store, "r1", 3.0, finish=False)
    return url


def rewards(*args: str, stats: Path) -> str:
    result = runner.invoke(app, ["rewards", *args, "--stats", str(stats)], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def test_score_says_how_many_unfinished_sessions_it_skipped(db: str, tmp_path: Path) -> None:
    output = rewards("score", "--db", db, stats=tmp_path / "stats.json")
    assert "4 sessions: 4 new reward versions" in output
    assert "2 unfinished session(s) skipped" in output
    with SessionStore.open(db) as store:
        assert store.rewards("r0") == []


def test_rescore_skips_unfinished_sessions_as_score_does(db: str, tmp_path: Path) -> None:
    output = rewards("rescore", "--since", "2000-01-01T00:00:00Z", "--db", db, stats=tmp_path / "stats.json")
    assert "4 sessions: 4 new reward versions" in output
    with SessionStore.open(db) as store:
        assert [store.rewards(sid) for sid in ("r0", "r1")] == [[], []]
        assert all(store.rewards(f"f{i}") for i in range(4))


@pytest.mark.parametrize(
    ("session_id", "hint"),
    [("f0", "run `sessionrl rewards score` first"), ("r0", "it is executing; sessions are scored once")],
)
def test_explaining_a_session_never_scored_says_what_to_do(db: str, session_id: str, hint: str) -> None:
    result = runner.invoke(app, ["rewards", "explain", session_id, "--db", db], terminal_width=200)
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: session {session_id} has no reward yet: {hint}")


def test_explain_shows_raw_and_normalised_values_and_the_normaliser(db: str, tmp_path: Path) -> None:
    rewards("score", "--db", db, stats=tmp_path / "stats.json")
    with SessionStore.open(db) as store:
        vector = RewardVector.model_validate(store.reward("f3").vector)
    experience = vector.layers["experience"]
    assert experience.seen == 3  # f0, f1, f2 were scored before f3 (in id order)
    # the centre: the mean of the ratings' (r - 3) / 2, -1, -0.5 and 0.5, shrunk by 10 pseudo-sessions
    assert experience.mean == pytest.approx((-1.0 - 0.5 + 0.5) / (3 + 10))
    output = rewards("explain", "f3", "--db", db, stats=tmp_path / "stats.json")
    row = next(line for line in output.splitlines() if line.strip("│ ").startswith("experience"))
    cells = [cell.strip() for cell in row.strip("│").split("│")]
    assert cells[:5] == [
        "experience",
        f"{experience.raw:+.3f}",
        f"{experience.mean:+.3f}",
        f"{experience.scale:.3f}",
        f"{experience.normalised:+.3f}",
    ]
    rules = vector.ruleset_version
    said = "normaliser: the running mean (shrunk towards 0) and scale (at least 1) of each layer under rules"
    assert f"{said} {rules}" in " ".join(output.split())
    first = rewards("explain", "f0", "--db", db, stats=tmp_path / "stats.json")
    assert "normaliser: not started" in first


def test_a_clipped_layer_is_marked() -> None:
    clipped = LayerValue(
        raw=0.0, normalised=-5.0, weight=1.0, scale=1.5, contribution=-5.0, mean=9.0, seen=40
    )
    assert is_clipped(clipped)
    assert not is_clipped(clipped.model_copy(update={"normalised": -6.0}))  # (0 - 9) / 1.5 exactly
    assert not is_clipped(clipped.model_copy(update={"mean": None}))  # stored before the centre was kept
