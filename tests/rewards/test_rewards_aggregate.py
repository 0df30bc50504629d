"""Several raters, one reward: ratings of one kind on one anchor combine by the rule file's `aggregate`
(mean by default, median, weighted by source), and the vector names every source."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import orjson
import pytest
from rewards_support import T0, ZH_COMMENT, build, feedback, tool
from typer.testing import CliRunner

from sessionrl.cli import app as cli
from sessionrl.rewards.aggregate import Aggregate, combine
from sessionrl.rewards.engine import RewardConfig, RewardEngine
from sessionrl.rewards.rules import default_rules_path
from sessionrl.rewards.terms import human_rating
from sessionrl.rewards.vector import RewardVector
from sessionrl.session import Anchor, Feedback, FeedbackType, Session

FT = FeedbackType
HOUR = 3600.0
SEED = Path(__file__).resolve().parents[2].parent / "shared" / "seed-examples" / "anemia-session.json"
runner = CliRunner()


def rated(annotator: str, score: float, occurred: float, anchor: Anchor | None = None) -> Feedback:
    """A human rating by `annotator`, `occurred` seconds after T0."""
    item = feedback(FT.HUMAN_RATING, score, occurred=occurred, anchor=anchor, feedback_id=f"f-{annotator}")
    return item.model_copy(update={"annotator": annotator})


def two_raters(*extra: Feedback) -> Session:
    """doc_007 rates the session 4; doc_012 rates it 2, 2.5 hours later."""
    return build([tool("t1")], [rated("doc_007", 4, 100), rated("doc_012", 2, 100 + 2.5 * HOUR), *extra])


def engine_with(tmp_path: Path, settings: str) -> RewardEngine:
    """An engine on the shipped rules with the aggregation settings replaced by `settings`."""
    text = default_rules_path().read_text()
    text = text.replace("aggregate: mean\nsource_weights: {}\n", settings)
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return RewardEngine(RewardConfig(rules=path), clock=lambda: T0 + timedelta(days=1))


def term(vector: RewardVector, name: str) -> tuple[float, str]:
    found = next(t for t in vector.terms if t.name == name)
    return found.value, found.explanation


def test_the_default_is_the_mean_and_names_each_source() -> None:
    vector = RewardEngine(clock=lambda: T0 + timedelta(days=1)).score(two_raters())
    value, why = term(vector, "human_rating")
    assert value == pytest.approx(0.0)  # mean of (4 - 3) / 2 = 0.5 and (2 - 3) / 2 = -0.5
    assert "doc_007 +0.5" in why
    assert "doc_012 -0.5" in why
    assert "mean" in why
    assert vector.rating == pytest.approx(3.0)  # mean of 4 and 2
    assert vector.rated_by == ("doc_007", "doc_012")


def test_median_resists_one_outlier(tmp_path: Path) -> None:
    engine = engine_with(tmp_path, "aggregate: median\nsource_weights: {}\n")
    session = two_raters(rated("nurse_chen", 5, 200))
    value, why = term(engine.score(session), "human_rating")
    assert value == pytest.approx(0.5)  # median of 0.5, -0.5, 1.0
    assert "median of" in why
    assert "nurse_chen +1" in why
    assert engine.score(session).rating == pytest.approx(4.0)  # median of 4, 2, 5


def test_weighted_by_source(tmp_path: Path) -> None:
    engine = engine_with(tmp_path, "aggregate: weighted\nsource_weights: {doc_007: 3.0}\n")
    vector = engine.score(two_raters())
    assert term(vector, "human_rating")[0] == pytest.approx(0.25)  # (3 * 0.5 + 1 * -0.5) / 4
    assert vector.rating == pytest.approx(3.5)  # (3 * 4 + 1 * 2) / 4


def test_ratings_on_different_anchors_still_add_up() -> None:
    on_call = rated("doc_012", 5, 300, anchor=Anchor(call_id="t1"))
    vector = RewardEngine(clock=lambda: T0 + timedelta(days=1)).score(
        build([tool("t1")], [rated("doc_007", 4, 100), on_call])
    )
    assert term(vector, "human_rating")[0] == pytest.approx(1.5)  # 0.5 (session) + 1.0 (call t1)


def test_two_raters_asking_for_one_correction_are_charged_it_once() -> None:
    session = two_raters().model_copy(
        update={
            "feedback": tuple(f.model_copy(update={"comment": ZH_COMMENT}) for f in two_raters().feedback)
        }
    )
    value, why = term(RewardEngine(clock=lambda: T0 + timedelta(days=1)).score(session), "judge_correction")
    assert value == pytest.approx(-0.2)  # chronic_disease_exclusion/high, the mean of two equal charges
    assert "f-doc_007 by doc_007" in why
    assert "f-doc_012 by doc_012" in why


def test_a_bad_aggregate_is_refused_when_the_file_loads(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="aggregate"):
        engine_with(tmp_path, "aggregate: mode\nsource_weights: {}\n")
    with pytest.raises(Exception, match="source_weights"):
        engine_with(tmp_path, "aggregate: weighted\nsource_weights: {doc_007: 0}\n")


def test_human_rating_takes_each_raters_latest() -> None:
    session = two_raters(rated("doc_007", 1, 50, anchor=Anchor(call_id="t1")))
    rating = human_rating(session)
    assert rating is not None
    assert rating.score == pytest.approx(3.0)  # doc_007's latest is the 4 at t=100, not the 1 at t=50
    assert combine([("a", 1.0)], Aggregate.MEDIAN) == 1.0


def test_explain_names_both_raters_of_the_design_documents_session(tmp_path: Path) -> None:
    """The worked session imported with a second rating 2.5 hours after the first: `rewards explain` gives
    the mean rating and names both raters."""
    seed = orjson.loads(SEED.read_bytes())
    second = {**seed["feedback"][0], "score": 2, "annotator_id": "doc_012"}
    second |= {"comment": "建议补充CRP和ESR检查", "timestamp": "2024-03-20T10:53:15.333Z"}
    (tmp_path / "two.json").write_bytes(orjson.dumps({**seed, "feedback": [*seed["feedback"], second]}))
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    imported = runner.invoke(cli, ["sessions", "import", str(tmp_path / "two.json"), "--db", url])
    assert imported.exit_code == 0, imported.output
    explained = runner.invoke(
        cli, ["rewards", "explain", "sess_abc123", "--fresh", "--db", url], terminal_width=250
    )
    assert explained.exit_code == 0, explained.output
    text = " ".join(explained.output.replace("│", " ").split())
    assert "rating 3.0 by doc_007, doc_012" in text  # the mean of 4 and 2
    assert "doc_007 +0.5" in text
    assert "doc_012 -0.5" in text
