"""Missing demonstrations are counted by reason, and more than 5% of them missing stops a run."""

from __future__ import annotations

import pytest

from sessionrl.episodes import MAX_MISSING, MissingDemonstrations, Ran, Tally, require
from sessionrl.errors import SessionRLError


def ran(*reasons: str | None) -> list[Ran]:
    """One episode per reason; None: solved."""
    return [Ran(f"s-{i}", reason is None, reason) for i, reason in enumerate(reasons)]


def test_a_tally_counts_each_reason_and_the_tasks_that_were_never_there() -> None:
    tally = Tally.of(
        6, ran(None, "plan_rejected:repeated_tool", None, "plan_rejected:repeated_tool", "unsolved:state")
    )
    assert (tally.requested, tally.usable, tally.missing) == (6, 2, 4)
    assert tally.reasons == {"plan_rejected:repeated_tool": 2, "unsolved:state": 1, "no_task": 1}
    assert tally.missing_share == pytest.approx(4 / 6)
    assert tally.describe() == (
        "2 of 6 demonstrations usable; 4 missing: 2 plan_rejected:repeated_tool, 1 no_task, 1 unsolved:state"
    )
    assert tally.as_record() == {
        "requested": 6,
        "usable": 2,
        "missing": 4,
        "missing_share": pytest.approx(4 / 6),
        "missing/plan_rejected:repeated_tool": 2,
        "missing/unsolved:state": 1,
        "missing/no_task": 1,
    }


def test_nothing_missing_says_so() -> None:
    tally = Tally.of(3, ran(None, None, None))
    assert (tally.missing, tally.reasons, tally.missing_share) == (0, {}, 0.0)
    assert tally.describe() == "3 of 3 demonstrations usable"
    assert Tally.of(0, []).missing_share == 0.0


def test_up_to_five_percent_missing_passes_and_one_more_stops_the_run() -> None:
    assert MAX_MISSING == 0.05
    at_limit = Tally.of(40, ran(*[None] * 38, "call_failed:UNAVAILABLE", "unsolved:outputs"))
    assert require(at_limit) is at_limit  # 2 of 40 = 5%
    over = Tally.of(40, ran(*[None] * 37, "call_failed:UNAVAILABLE", "unsolved:outputs", "unsolved:outputs"))
    with pytest.raises(MissingDemonstrations) as raised:
        require(over)
    assert isinstance(raised.value, SessionRLError)  # the CLI turns it into one line and exit status 1
    assert raised.value.tally is over
    message = str(raised.value)
    assert (
        "37 of 40 demonstrations usable; 3 missing: 2 unsolved:outputs, 1 call_failed:UNAVAILABLE" in message
    )
    assert "more than 5%" in message


def test_a_stricter_limit_can_be_asked_for() -> None:
    tally = Tally.of(100, ran(*[None] * 99, "unjudged"))
    require(tally)
    with pytest.raises(MissingDemonstrations, match=r"1 missing: 1 unjudged; more than 0%"):
        require(tally, limit=0.0)
