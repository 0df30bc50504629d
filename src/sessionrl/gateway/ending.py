"""How a session captured through the gateway ends, and what the session records of it.

An agent loop has no "goodbye" on the OpenAI wire, so the gateway ends a session in one of three ways,
whichever comes first, and names it in the session's `finished_by` metadata (and the reason of its
state change):

- `finish_call`: the agent (or whoever runs it) calls `POST /v1/sessions/{session_id}/finish` with the
  final output;
- `final_answer`: the model answers without a tool call (`GatewayConfig.finish_on_answer`): that
  answer's text is the final output;
- `idle`: no request reached the session for `GatewayConfig.idle_finish_s`; the last thing the model
  said is the final output.

A finished session is scored by `sessionrl rewards score` and read by training like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from sessionrl.errors import InvalidTransition, NotFound, SessionRLError
from sessionrl.gateway.config import GatewayConfig
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.session.lifecycle import ACTIVE
from sessionrl.session.model import SessionState, utcnow
from sessionrl.store import SessionQuery

FINISH_CALL, FINAL_ANSWER, IDLE = "finish_call", "final_answer", "idle"
"""What ended a session: the finish route, the model's answer without a tool call, or idle time."""
GATEWAY_TAG = "gateway"
"""The tag of every session the gateway opened."""
SWEEP_LIMIT = 1000
"""The most idle sessions one sweep finishes (the next sweep takes the rest)."""

log = logging.getLogger(__name__)


async def finish_answered(engine: Orchestrator, session_id: str, text: str) -> None:
    """Finish `session_id` with the model's answer `text`, which carried no tool call."""
    with contextlib.suppress(InvalidTransition):  # a concurrent request or the sweep ended it first
        await engine.finish(session_id, text, key=f"gateway-final {session_id}", reason=FINAL_ANSWER)


async def finish_idle(
    engine: Orchestrator, idle_s: float, now: datetime | None = None, *, projection_rows: int | None = None
) -> list[str]:
    """Finish every gateway session still active that no request reached for `idle_s`, as far as the
    store's query tables know them; return their ids. The output is the last thing the model said in the
    session (empty when it said nothing).

    With `projection_rows`, the query tables are first brought forward by at most that many outbox rows,
    not drained whole (`SessionStore.project`): a serving process must not pay for a backlog in one go
    (projecting is Python work that holds the interpreter lock, and on a busy service draining tens of
    thousands of rows stalled every request for about a second). A candidate is read afresh before it is
    finished, so tables that lag never end a session a request reached since."""
    cutoff = (now or utcnow()) - timedelta(seconds=idle_s)
    finished: list[str] = []
    if projection_rows is not None:
        await asyncio.to_thread(engine.store.project, projection_rows)
    for state in (SessionState.CREATED, SessionState.EXECUTING):
        query = SessionQuery(state=state, tags=(GATEWAY_TAG,), order_by="updated_at", limit=SWEEP_LIMIT)
        rows = await asyncio.to_thread(engine.store.query, query, fresh=projection_rows is None)
        for row in rows:
            if row.updated_at > cutoff:
                break  # ordered by last change: the rest are more recent still
            try:
                session = await engine.session(row.session_id)
                if session.state not in ACTIVE or session.updated_at > cutoff:
                    continue  # ended, or reached by a request, since the tables were projected
                last = session.llm_calls[-1].response if session.llm_calls else ""
                await engine.finish(row.session_id, last, key=f"gateway-idle {row.session_id}", reason=IDLE)
            except (InvalidTransition, NotFound):
                continue  # ended (or gone) since the query
            finished.append(row.session_id)
    return finished


async def sweep_idle(engine_of: Callable[[], Orchestrator | None], config: GatewayConfig) -> None:
    """Finish idle gateway sessions every `config.sweep_every_s` until cancelled (the app's lifespan runs
    it); a failed sweep is logged and the next one tries again."""
    if config.idle_finish_s is None:
        return
    while True:
        await asyncio.sleep(config.sweep_every_s)
        engine = engine_of()
        if engine is None:
            continue
        try:
            ended = await finish_idle(
                engine, config.idle_finish_s, projection_rows=config.sweep_projection_rows
            )
        except SessionRLError:
            log.exception("the gateway's idle sweep failed; the next one tries again")
            continue
        if ended:
            log.info("finished %d idle gateway session(s)", len(ended))
