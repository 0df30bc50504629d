"""A small store for the session list's tests: the Chinese seed session (imported as the CLI imports it),
a solved, a failed and a judged session, and a run folder with its own store of rl and eval episodes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from typer.testing import CliRunner

from sessionrl.cli import app as cli
from sessionrl.session import FeedbackAdded, LLMCallRecorded, StateChanged, ToolCallRecorded
from sessionrl.session.model import (
    Anchor,
    CallStatus,
    Feedback,
    FeedbackType,
    LLMCall,
    SessionCreate,
    SessionState,
    ToolCall,
)
from sessionrl.store import SessionStore

SEED = Path(__file__).resolve().parents[2].parent / "shared" / "seed-examples" / "anemia-session.json"
SEED_ID = "sess_abc123"
T0 = datetime(2026, 2, 1, 9, 0, tzinfo=UTC)


def import_seed(db_url: str) -> None:
    """Import the seed file through `sessionrl sessions import`."""
    result = CliRunner().invoke(cli, ["sessions", "import", str(SEED), "--db", db_url], terminal_width=200)
    assert result.exit_code == 0, result.output


def episode(
    store: SessionStore,
    sid: str,
    *,
    scenario: str,
    solved: bool | None,
    stage: str | None = None,
    error: str | None = None,
    unparseable: bool = False,
    policy: int | None = None,
    ms: int = 100,
) -> None:
    """A finished session: one tool call of `ms` ms (failing with `error`), one LLM call (judged
    unparseable when asked), and a task verdict when `solved` is not None."""
    store.create(
        SessionCreate(
            session_id=sid,
            user_query=f"help with {scenario}",
            scenario=scenario,
            metadata={} if stage is None else {"stage": stage},
        )
    )
    status = CallStatus.ERROR if error else CallStatus.SUCCESS
    tool = ToolCall(
        call_id=f"{sid}-t",
        tool="lookup_order",
        status=status,
        error_code=error,
        output=None if error else {"note": f"{sid} parcel left at the depot"},
        latency_ms=ms,
        started_at=T0,
        finished_at=T0 + timedelta(milliseconds=ms),
    )
    llm = LLMCall(
        call_id=f"{sid}-l",
        response="{not an action" if unparseable else "done",
        policy_version=policy,
        started_at=T0 + timedelta(milliseconds=ms),
        finished_at=T0 + timedelta(milliseconds=ms + 20),
    )
    events: list[object] = [
        StateChanged(state=SessionState.EXECUTING),
        ToolCallRecorded(call=tool),
        LLMCallRecorded(call=llm),
    ]
    if unparseable:
        charge = Feedback(
            type=FeedbackType.AUTO_VALIDATION,
            score=0.0,
            comment="UNPARSEABLE_ACTION: not an action",
            anchor=Anchor(call_id=llm.call_id),
        )
        events.append(FeedbackAdded(feedback=charge))
    if solved is not None:
        verdict = Feedback(type=FeedbackType.TASK_OUTCOME, score=1.0 if solved else 0.0, annotator="checker")
        events.append(FeedbackAdded(feedback=verdict))
    events.append(StateChanged(state=SessionState.FINISHED))
    for e in events:
        store.append(sid, e)  # type: ignore[arg-type]


def fill(db: Path, runs: Path) -> None:
    """The list's store at `db`, and the run `r1` under `runs` with its own store."""
    url = f"sqlite:///{db}"
    import_seed(url)
    with SessionStore.open(url) as store:
        episode(store, "solved-1", scenario="orders-refund", solved=True, policy=3, ms=100)
        episode(store, "failed-1", scenario="orders-address", solved=False, error="UNAVAILABLE", ms=2500)
        episode(store, "judged-1", scenario="clinic-triage", solved=None, unparseable=True, policy=4, ms=300)
        store.save_reward("solved-1", {"session_reward": 0.8, "long_term_reward": 0.5}, "r1")
        store.save_reward("failed-1", {"session_reward": -0.5, "long_term_reward": -0.2}, "r1")
        store.save_reward("failed-1", {"session_reward": 0.1, "long_term_reward": 0.0}, "r2")
    run = runs / "r1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("trainer: grpo\n")
    with SessionStore.open(f"sqlite:///{run / 'sessions.db'}") as store:
        for k in range(3):
            episode(store, f"rl-{k}", scenario="orders-refund", solved=k == 0, stage="rl", policy=1)
        episode(store, "eval-0", scenario="orders-refund", solved=False, stage="eval", policy=2)
