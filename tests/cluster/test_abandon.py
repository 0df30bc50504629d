"""A cut-off episode's sessions are closed as abandoned: rejected, tagged, the reason kept; once."""

from __future__ import annotations

import pytest

from sessionrl.envs.base import Split, Task
from sessionrl.episodes import EpisodeSpec
from sessionrl.session import Feedback, FeedbackType, SessionCreate, SessionState
from sessionrl.session.events import FeedbackAdded, StateChanged
from sessionrl.store import SessionStore

pytest.importorskip("ray", reason="Ray is not installed (pip install 'sessionrl[cluster]')")
from sessionrl.cluster.ray_rollout import ABANDONED, abandon


def test_open_attempts_without_a_verdict_are_abandoned_once() -> None:
    task = Task(task_id="t1", split=Split.TRAIN, instruction="do it")
    with SessionStore.open("sqlite://") as store:
        for sid in ("e1", "e1.1", "e1.2"):
            store.create(SessionCreate(user_query="q", session_id=sid, tags=("rl",)))
        store.append("e1.1", StateChanged(state=SessionState.EXECUTING))
        verdict = Feedback(type=FeedbackType.TASK_OUTCOME, score=1.0, data={"success": True})
        store.append("e1.2", FeedbackAdded(feedback=verdict))
        closed = abandon(store, EpisodeSpec(task, "e1"), "rollout worker w.1 died")
        assert closed == ["e1", "e1.1"]
        for sid in closed:
            session = store.get(sid)
            assert session.state is SessionState.REJECTED
            assert session.tags == ("rl", ABANDONED)
            assert session.metadata[ABANDONED] == "rollout worker w.1 died"
            assert store.events(sid)[-1].event.reason == f"{ABANDONED}: rollout worker w.1 died"  # type: ignore[union-attr]
        assert store.get("e1.2").state is SessionState.CREATED  # judged: left alone
        assert abandon(store, EpisodeSpec(task, "e1"), "again") == []
