"""Units of writes: all of a unit or none of it, and a unit's basis refused once another writer wrote."""

from __future__ import annotations

from sessionrl.errors import InvalidTransition, StaleState
from sessionrl.session import (
    Feedback,
    FeedbackAdded,
    FeedbackType,
    FinalOutput,
    OutputSet,
    SessionCreate,
    StateChanged,
    created,
)
from sessionrl.store import SessionStore
from sessionrl.store.writes import OwnWrites, Unit


def finish_unit(sid: str, version: int) -> Unit:
    """An output and the state change to `finished`, with chained expected versions from `version`."""
    out = OutputSet(output=FinalOutput(text="done"))
    return Unit([(sid, out, version), (sid, StateChanged(state="finished"), version + 1)])


def test_a_unit_refused_at_its_first_write_writes_none_of_the_others(running: SessionStore) -> None:
    [results] = running.append_units([finish_unit("s1", 3)])  # s1 is at version 4
    assert all(isinstance(r, StaleState) for r in results)
    assert running.get("s1").state_version == 4
    assert running.get("s1").state.value == "executing"
    assert len(running.events("s1")) == 4


def test_a_unit_refused_at_a_later_write_is_undone_and_the_batch_goes_on(running: SessionStore) -> None:
    running.create(SessionCreate(user_query="q", session_id="s2"))
    bad = Unit([("s1", StateChanged(state="planning"), 4), ("s1", StateChanged(state="archived"), 5)])
    good = Unit([("s2", StateChanged(state="executing"), 1)])
    then = Unit([("s1", StateChanged(state="planning"), 4)])
    refused, written, after = running.append_units([bad, good, then])
    assert all(isinstance(r, InvalidTransition) for r in refused)
    assert [getattr(r, "state_version", None) for r in written + after] == [2, 5]
    assert [e.type for e in running.events("s1")][-1] == "state_changed"
    assert running.get("s1").state.value == "planning"
    assert len(running.events("s1")) == 5
    assert running.consistency_check().clean


def test_a_basis_stays_good_across_the_writers_own_appends_only(running: SessionStore) -> None:
    mine, theirs = OwnWrites(), OwnWrites()

    def append(own: OwnWrites, basis: int) -> object:
        note = FeedbackAdded(feedback=Feedback(type=FeedbackType.COMMENT, comment="noted"))
        return running.append_units([Unit([("s1", note, None)], basis)], own)[0][0]

    assert not isinstance(append(mine, 4), Exception)  # 4 -> 5, mine
    assert not isinstance(append(mine, 4), Exception)  # built on 4, the store at 5: mine since, 5 -> 6
    assert not isinstance(append(theirs, 6), Exception)  # another writer: 6 -> 7
    stale = append(mine, 6)
    assert isinstance(stale, StaleState)  # built on 6, but version 7 is not mine
    assert (stale.expected, stale.actual) == (6, 7)
    assert not isinstance(append(mine, 7), Exception)
    assert running.get("s1").state_version == 8


def test_a_forgotten_run_accepts_an_exact_basis_only() -> None:
    own = OwnWrites(capacity=1)
    own.record("s1", 1, 4)
    own.record("s2", 1, 2)
    assert own.base("s1", 4) == 4  # s1's run was evicted: nothing is known to be own
    assert own.base("s2", 2) == 1
    own.record("s2", 5, 6)  # after someone else's 3..5
    assert own.base("s2", 6) == 5


def test_a_batch_of_one_writers_units_on_one_session_builds_on_each_other() -> None:
    with SessionStore.open("sqlite://") as store:
        own = OwnWrites()
        store.append_units(
            [Unit([("s1", created(SessionCreate(user_query="q", session_id="s1")), None)])], own
        )
        units = [Unit([("s1", StateChanged(state=s), None)], basis=1) for s in ("executing", "planning")]
        results = store.append_units(units, own)
        assert [r[0].state_version for r in results if not isinstance(r[0], Exception)] == [2, 3]
