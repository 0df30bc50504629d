"""The session orchestrator: opens sessions, runs plan / tool / LLM steps, takes feedback, finishes.

Every change is an event committed to the store before the call returns, so whatever the engine
acknowledged survives a crash. Steps of different kinds run in their own lanes (see `lanes`); active
sessions are kept in an LRU whose entries are only ever sessions the store returned after a commit. A
session leaves it when it ends (finished, rejected, archived): feedback that arrives later is rare, and
reads the store.

A step's events form one unit. A unit of one event is appended to whatever the store holds (tool calls
commute); a longer unit is checked by folding it locally, then appended with chained expected versions,
so it is written whole or not at all. A unit that lost a race (`StaleState`) is rebuilt on the fresh
session and tried again.

Several engines may serve one store (`sessionrl serve` processes sharing a PostgreSQL database, or
engines in one process), and any of them any session: per-session serialisation is versions with
retry. A step is built on the cached view, and its unit names the version it was built on (its
`basis`); the store, inside the transaction that writes it and holding the session's lock, refuses it
(`StaleState`) if any other writer appended since, and the step is rebuilt on the session read afresh.
The engine's own concurrent steps do not refuse each other (the committer remembers which versions it
wrote), so tool calls still commute. Nothing is held while a tool runs, and only the store's
transaction-scoped locks order writers, so a process that dies holds up nobody. Reads made for a
caller (`session`) come from the store, checked against its version, not from the cache.

Idempotency: a caller may pass `key`. Every id the request writes is derived from it (`StepIds`), the
store ignores an event id it already holds, and a request whose last event is already in the log is
answered from the log without running anything again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from sessionrl.errors import InvalidEvent, InvalidTransition, SessionRLError, StaleState
from sessionrl.orchestrator.commit import GroupCommitter
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.guards import (
    StepRefusal,
    check_plan,
    check_tool_step,
    missing_citations,
    unverified_subgoals,
)
from sessionrl.orchestrator.lanes import Lane, route
from sessionrl.orchestrator.policy import (
    PolicyBackend,
    PolicyError,
    PolicyReply,
    act_messages,
    parse_plan,
    parse_tool_call,
    plan_messages,
)
from sessionrl.orchestrator.recording import (
    ContractCheck,
    recorded_llm_call,
    recorded_tool_call,
    same_request,
)
from sessionrl.orchestrator.results import (
    PAYLOADS,
    FeedbackResult,
    FinishResult,
    IdSource,
    KeyReused,
    LLMPayload,
    PlanPayload,
    StepError,
    StepIds,
    StepKind,
    StepPayload,
    StepResult,
    ToolPayload,
    call_ids,
    feedback_result,
    finish_result,
    llm_result,
    may_be_replay,
    plan_result,
    replayed_result,
    tool_result,
)
from sessionrl.session.events import (
    Event,
    FeedbackAdded,
    LLMCallRecorded,
    OutputSet,
    PlanSet,
    SessionPatched,
    StateChanged,
    ToolCallRecorded,
    apply,
    created,
    fold,
)
from sessionrl.session.lifecycle import ACTIVE, TERMINAL
from sessionrl.session.model import (
    Anchor,
    CallStatus,
    Feedback,
    FeedbackType,
    FinalOutput,
    LLMCall,
    Message,
    Plan,
    Session,
    SessionCreate,
    SessionPatch,
    SessionState,
    ToolCall,
    utcnow,
)
from sessionrl.skills.contract import SkillContract
from sessionrl.skills.skill import SkillResult
from sessionrl.store import SessionStore
from sessionrl.store.cache import SessionCache

T = TypeVar("T")
Build = Callable[[Session], list[Event]]
"""Builds a step's unit of events on the session as it stands (called again after a lost race)."""


class Executor(Protocol):
    """What the engine needs of a skill executor (`sessionrl.skills.SkillExecutor` is one)."""

    @property
    def contracts(self) -> dict[str, SkillContract]: ...

    def masked(self) -> frozenset[str]: ...

    async def call(self, name: str, params: Mapping[str, Any]) -> SkillResult: ...


class Chooser(Protocol):
    """Picks the backend that answers a session's next policy call (`sessionrl.ops` routes versions and
    degrades with one); raising `PolicyError` fails the step, unrecorded, with that message."""

    async def __call__(self, engine: Orchestrator, session: Session) -> PolicyBackend: ...


class Orchestrator:
    """The engine. Use as `async with Orchestrator(store, executor, backends) as engine:`."""

    def __init__(
        self,
        store: SessionStore,
        executor: Executor,
        backends: Sequence[PolicyBackend] = (),
        config: OrchestratorConfig | None = None,
        *,
        chooser: Chooser | None = None,
    ) -> None:
        self.store = store
        self.executor = executor
        self.backends = tuple(backends)
        self.chooser = chooser
        """Picks the backend per policy call; none: `route` over `backends`."""
        self.config = config or OrchestratorConfig()
        self.cache = SessionCache(self.config.cache_size)
        self.lanes = {
            StepKind.PLAN: Lane("plan", self.config.plan_lane),
            StepKind.TOOL: Lane("tool", self.config.tool_lane),
            StepKind.LLM: Lane("llm", self.config.llm_lane),
        }
        self.committer = GroupCommitter(
            store,
            max_events=self.config.commit_batch,
            gather_s=self.config.commit_gather_s,
            sessions=self.config.cache_size,
        )
        self._inflight: dict[str, asyncio.Future[Any]] = {}
        self._chained: dict[str, list[asyncio.Future[None]]] = {}
        """Sessions with a unit of several events being committed, and the steps waiting for it to end."""
        self._ids = IdSource()
        self._contract_check = ContractCheck()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Commit what is queued and stop the writer; closing the store and executor is the caller's job."""
        await self.committer.aclose()

    # public API

    async def init_session(self, create: SessionCreate | str, *, key: str | None = None) -> str:
        """Open a session (a `SessionCreate`, or just the user's query) and return its id."""
        if isinstance(create, str):
            create = SessionCreate(user_query=create)
        ids = self._ids.ids(key)
        if create.session_id is not None and await self._exists(create.session_id):
            if key is not None and await self._replayed(create.session_id, ids) is not None:
                return create.session_id
            state = (await self.session(create.session_id)).state
            raise InvalidTransition(create.session_id, state, "session_created")
        event = created(create, event_id=ids.event())
        (result,) = await self.committer.commit([(event.session_id, event, None)])
        if isinstance(result, InvalidEvent) and result.field == "event_id" and key is not None:
            raise KeyReused(key, "a create naming another session") from result
        session = _raise_first([result])
        self._remember(session)
        return session.session_id

    async def session(self, session_id: str) -> Session:
        """The session's current read view, as stored (another process may have written it since this
        engine last did); the cache is brought up to date with it."""
        session = await asyncio.to_thread(self.store.get, session_id)
        self._remember(session)
        return session

    async def execute_step(
        self,
        session_id: str,
        kind: StepKind | str,
        payload: StepPayload | Mapping[str, Any] | None = None,
        *,
        key: str | None = None,
        expected_version: int | None = None,
    ) -> StepResult:
        """Run one step of `kind` with its payload (a payload model, or a mapping validated as one).

        With `expected_version`, the step runs only if the session is at that version (else `StaleState`).
        """
        kind = StepKind(kind)
        model = PAYLOADS[kind]
        typed = payload if isinstance(payload, model) else model.model_validate(payload or {})
        ids = self._ids.ids(key)
        return await self._once(key, lambda: self._step(session_id, kind, typed, ids, key, expected_version))

    async def inject_feedback(
        self, session_id: str, feedback: Feedback, *, key: str | None = None
    ) -> FeedbackResult:
        """Record feedback (accepted in every state). With `key`, the feedback id is derived from it."""
        ids = self._ids.ids(key)
        if key is not None:
            feedback = feedback.model_copy(update={"feedback_id": ids.feedback()})
        event = FeedbackAdded(feedback=feedback, event_id=ids.event())

        async def run() -> FeedbackResult:
            session = await self._commit(session_id, lambda _: [event], ids)
            return feedback_result(session, feedback.feedback_id)

        return await self._once(key, run)

    async def finish(
        self,
        session_id: str,
        output: FinalOutput | str,
        *,
        key: str | None = None,
        expected_version: int | None = None,
    ) -> FinishResult:
        """Give the final output and close the session, running the finishing guards.

        Every sub-goal that no tool call executed earns a `hallucination_penalty` anchored to it; claims
        citing calls the session does not have earn one `provenance_flag` naming them.
        """
        if isinstance(output, str):
            output = FinalOutput(text=output)
        ids = self._ids.ids(key)
        final = output

        async def run() -> FinishResult:
            session = await self._checked(session_id, expected_version)
            if key is not None and session.state in TERMINAL:
                replayed = await self._replayed(session_id, ids)
                if replayed is not None:
                    return finish_result(replayed)
            _check_version(session, expected_version)
            try:
                committed = await self._commit(session_id, lambda s: self._finish_unit(s, final, ids), ids)
            except InvalidTransition:  # the view was behind: another process may have run this request
                replayed = None if key is None else await self._replayed(session_id, ids)
                if replayed is None:
                    raise
                return finish_result(replayed)
            return finish_result(committed)

        return await self._once(key, run)

    async def patch(self, session_id: str, patch: SessionPatch, *, key: str | None = None) -> Session:
        """Change a session's scenario, tags or metadata (accepted in every state); return the session."""
        ids = self._ids.ids(key)
        event = SessionPatched(patch=patch, event_id=ids.event())
        return await self._once(key, lambda: self._commit(session_id, lambda _: [event], ids))

    def route(self, session_id: str) -> PolicyBackend:
        """The backend that serves `session_id` (the same one every time, for its prompt cache)."""
        if not self.backends:
            raise PolicyError("no policy backend is configured")
        return self.backends[route(session_id, len(self.backends))]

    # steps

    async def _step(
        self,
        session_id: str,
        kind: StepKind,
        payload: StepPayload,
        ids: StepIds,
        key: str | None,
        expected_version: int | None,
    ) -> StepResult:
        session = await self._checked(session_id, expected_version, fresh=_asks_policy(payload))
        if key is not None and may_be_replay(session, kind, ids, payload):
            replayed = await self._replayed(session_id, ids)
            if replayed is not None:
                if not same_request(kind, payload, replayed, *call_ids(payload, ids)):
                    raise KeyReused(key, "a different request (another kind or body)")
                return replayed_result(kind, replayed, ids, self._masked(), payload)
        _check_version(session, expected_version)
        if session.state not in ACTIVE:
            raise InvalidTransition(session_id, session.state, f"{kind.value} step")
        if isinstance(payload, PlanPayload):
            return await self._plan(session, payload, ids)
        if isinstance(payload, ToolPayload):
            return await self._tool(session, payload, ids)
        return await self._llm(session, payload, ids)

    async def _plan(self, session: Session, payload: PlanPayload, ids: StepIds) -> StepResult:
        if session.plan is not None:
            raise InvalidTransition(
                session.session_id, session.state, "plan_set (the session already has a plan)"
            )
        before: list[Event] = []
        plan = payload.plan
        if plan is None:
            messages = payload.messages or plan_messages(session.user_query, self._visible_tools())
            reply = await self._ask(session, messages, StepKind.PLAN, "plan")
            if isinstance(reply, StepResult):
                return reply
            before.append(
                LLMCallRecorded(call=_llm_record(ids.llm, "plan", messages, reply), event_id=ids.event("llm"))
            )
            plan = parse_plan(reply.text)
        chosen = plan
        unit: Build = (
            (lambda _: before)
            if chosen is None
            else (lambda s: [*before, *self._plan_unit(s, chosen, ids, bool(before))])
        )
        return plan_result(await self._commit(session.session_id, unit, ids), ids, self._masked())

    def _plan_unit(self, session: Session, plan: Plan, ids: StepIds, by_policy: bool) -> list[Event]:
        """Record the plan; then either start executing, or reject it with a `plan_rejection` feedback."""
        problem = check_plan(
            plan,
            known_tools=self.executor.contracts.keys(),
            forbidden_tools=self.config.forbidden_tools,
            max_subgoals=self.config.max_subgoals,
            allow_repeated_tools=self.config.repeated_tools,
        )
        events: list[Event] = [PlanSet(plan=plan, event_id=ids.event("plan"))]
        if problem is None:
            return [*events, *_enter(session, SessionState.EXECUTING, ids)]
        rejection = Feedback(
            feedback_id=ids.feedback(),
            type=FeedbackType.PLAN_REJECTION,
            comment=problem.detail,
            annotator="plan_breaker",
            anchor=Anchor(call_id=ids.llm) if by_policy else Anchor(),
            data={"reason": problem.reason.value, "detail": problem.detail},
        )
        return [
            *events,
            FeedbackAdded(feedback=rejection, event_id=ids.event("reject")),
            StateChanged(state=SessionState.REJECTED, reason=problem.reason, event_id=ids.event("state")),
        ]

    async def _tool(self, session: Session, payload: ToolPayload, ids: StepIds) -> StepResult:
        if payload.result is not None:
            return await self._record_tool(session, payload, ids)
        before: list[Event] = []
        tool, params, subgoal_id = payload.tool, payload.params, payload.subgoal_id
        if tool is None:
            messages = payload.messages or act_messages(session, self._visible_tools())
            reply = await self._ask(session, messages, StepKind.LLM, "act", kind=StepKind.TOOL)
            if isinstance(reply, StepResult):
                return reply
            before.append(
                LLMCallRecorded(call=_llm_record(ids.llm, "act", messages, reply), event_id=ids.event("llm"))
            )
            choice = parse_tool_call(reply.text)
            if choice is None:
                return tool_result(
                    await self._commit(session.session_id, lambda _: before, ids), ids, self._masked()
                )
            tool, params, subgoal_id = choice.tool, choice.params, choice.subgoal_id or subgoal_id
        call_id = payload.call_id or ids.call
        session, refusal = await self._guarded(session, tool, subgoal_id, self.executor.masked())
        if refusal is None:
            call = await self._run_tool(call_id, tool, params, subgoal_id)
        else:
            call = ToolCall(
                call_id=call_id,
                subgoal_id=subgoal_id,
                tool=tool,
                params=params,
                status=CallStatus.REFUSED,
                error_code=refusal.reason.value,
                error_message=refusal.detail,
            )
        record = ToolCallRecorded(call=call, event_id=ids.event("call"))

        def unit(s: Session) -> list[Event]:
            return [*_enter(s, SessionState.EXECUTING, ids), *before, record]

        return tool_result(await self._commit(session.session_id, unit, ids), ids, self._masked(), call_id)

    async def _run_tool(
        self, call_id: str, tool: str, params: dict[str, Any], subgoal_id: str | None
    ) -> ToolCall:
        async with self.lanes[StepKind.TOOL].slot():
            started = utcnow()
            result = await self.executor.call(tool, params)
            finished = utcnow()
        status = CallStatus.SUCCESS if result.ok else CallStatus.ERROR
        if result.error_code in ("TIMEOUT", "SANDBOX_TIMEOUT"):
            status = CallStatus.TIMEOUT
        return ToolCall(
            call_id=call_id,
            subgoal_id=subgoal_id,
            tool=result.skill,
            params=params,
            output=result.output,
            status=status,
            error_code=result.error_code,
            error_message=result.error_message,
            retryable=result.retryable,
            latency_ms=result.latency_ms,
            attempt=max(result.attempts, 1),
            warnings=result.warnings,
            started_at=started,
            finished_at=finished,
        )

    async def _record_tool(self, session: Session, payload: ToolPayload, ids: StepIds) -> StepResult:
        """Record a call the agent made with its own tool, after the guards a server-run call passes (all
        but the breaker's mask, which is about the skills run here)."""
        call_id = payload.call_id or ids.call
        call = recorded_tool_call(
            session,
            payload,
            call_id,
            contracts=self.executor.contracts,
            check=self._contract_check,
            free_form=self.config.free_form_tools,
        )
        assert payload.tool is not None
        session, refusal = await self._guarded(session, payload.tool, payload.subgoal_id, ())
        if refusal is not None:
            update = {"status": CallStatus.REFUSED, "output": None, "error_code": refusal.reason.value}
            call = call.model_copy(update={**update, "error_message": refusal.detail})
        record = ToolCallRecorded(call=call, event_id=ids.event("call"))

        def unit(s: Session) -> list[Event]:
            return [*_enter(s, SessionState.EXECUTING, ids), record]

        committed = await self._commit(session.session_id, unit, ids)
        return tool_result(committed, ids, self._masked(), call_id)

    async def _llm(self, session: Session, payload: LLMPayload, ids: StepIds) -> StepResult:
        call_id = payload.call_id or ids.llm
        if payload.reply is not None:
            recorded = LLMCallRecorded(
                call=recorded_llm_call(session, payload, call_id), event_id=ids.event("llm")
            )
            committed = await self._commit(session.session_id, lambda _: [recorded], ids)
            return llm_result(committed, ids, self._masked(), call_id)
        messages = payload.messages or (Message(role="user", content=session.user_query),)
        reply = await self._ask(session, messages, StepKind.LLM, payload.purpose)
        if isinstance(reply, StepResult):
            return reply
        record = LLMCallRecorded(
            call=_llm_record(call_id, payload.purpose, messages, reply), event_id=ids.event("llm")
        )
        return llm_result(
            await self._commit(session.session_id, lambda _: [record], ids), ids, self._masked(), call_id
        )

    async def _ask(
        self,
        session: Session,
        messages: Sequence[Message],
        lane: StepKind,
        purpose: str,
        *,
        kind: StepKind | None = None,
    ) -> PolicyReply | StepResult:
        """The policy's reply in `lane`, or a failed (unrecorded) step result when the backend fails."""
        try:
            if self.chooser is None:
                backend = self.route(session.session_id)
            else:
                backend = await self.chooser(self, session)
            async with self.lanes[lane].slot():
                return await backend.generate(messages, purpose=purpose)
        except PolicyError as exc:
            return StepResult(
                ok=False,
                kind=kind or lane,
                session_id=session.session_id,
                state=session.state,
                state_version=session.state_version,
                error_code=StepError.POLICY_ERROR,
                error_message=str(exc),
                retryable=True,
                masked=self._masked(),
            )

    def _finish_unit(self, session: Session, output: FinalOutput, ids: StepIds) -> list[Event]:
        """The output, a penalty per unverified sub-goal, a flag for missing citations, then `finished`."""
        events: list[Event] = [OutputSet(output=output, event_id=ids.event("out"))]
        for i, subgoal_id in enumerate(unverified_subgoals(session)):
            penalty = Feedback(
                feedback_id=ids.feedback(f"h{i}"),
                type=FeedbackType.HALLUCINATION_PENALTY,
                score=self.config.hallucination_penalty,
                comment=f"no tool call executed sub-goal {subgoal_id!r}",
                annotator="finish_guard",
                anchor=Anchor(subgoal_id=subgoal_id),
            )
            events.append(FeedbackAdded(feedback=penalty, event_id=ids.event(f"h{i}")))
        missing = missing_citations(session, output)
        if missing:
            flag = Feedback(
                feedback_id=ids.feedback("p"),
                type=FeedbackType.PROVENANCE_FLAG,
                comment=f"the output cites calls the session does not have: {', '.join(missing)}",
                annotator="finish_guard",
                data={"missing_call_ids": list(missing)},
            )
            events.append(FeedbackAdded(feedback=flag, event_id=ids.event("flag")))
        return [*events, StateChanged(state=SessionState.FINISHED, event_id=ids.event("state"))]

    # plumbing

    async def _commit(self, session_id: str, build: Build, ids: StepIds) -> Session:
        """Commit the unit `build` makes, rebuilding it on the fresh session after a lost race.

        A unit of several events carries chained expected versions, so any write to its session that
        lands first makes it stale. While one is in flight, the engine's other units of that session
        wait for it (`_settled`) and are built on the session it leads to, instead of losing a race to
        it: concurrent first steps of a session then enter `executing` once, not once per loser.
        """
        for attempt in range(self.config.commit_retries):
            session = await self._settled(session_id)
            events = _seal(build(session), ids)
            waiters: list[asyncio.Future[None]] | None = [] if len(events) > 1 else None
            if waiters is not None:
                self._chained[session_id] = waiters
            try:
                committed = await self._commit_unit(session, events)
                self._remember(committed)
            except StaleState:
                if attempt + 1 == self.config.commit_retries:
                    raise
                self.cache.drop(session_id)
                continue
            finally:
                if waiters is not None:
                    del self._chained[session_id]
                    for waiter in waiters:
                        if not waiter.done():  # a cancelled waiter is done
                            waiter.set_result(None)
            return committed
        raise AssertionError("unreachable: the loop returns or raises")

    async def _settled(self, session_id: str) -> Session:
        """The session once no chained unit of it is in flight here (see `_commit`)."""
        while True:
            waiters = self._chained.get(session_id)
            if waiters is not None:
                waiter = asyncio.get_running_loop().create_future()
                waiters.append(waiter)  # its own future: cancelling one waiter cancels no other
                await waiter
                continue
            session = await self._view(session_id)
            if session_id not in self._chained:  # none began while the session was read from the store
                return session

    async def _commit_unit(self, session: Session, events: list[Event]) -> Session:
        """One event goes on whatever is stored if only this engine wrote since `session` (its basis);
        several carry chained expected versions (see the module doc)."""
        sid = session.session_id
        if len(events) == 1:
            commit = self.committer.commit([(sid, events[0], None)], basis=session.state_version)
            return _raise_first(await commit)
        local = session
        for event in events:  # raises (writing nothing) if the unit is not allowed as a whole
            local = apply(local, event)
        version = session.state_version
        writes = [(sid, event, version + i) for i, event in enumerate(events)]
        return _raise_first(await self.committer.commit(writes))

    def _remember(self, session: Session) -> None:
        """Cache an active session's latest view; an ended one leaves the cache."""
        if session.state in TERMINAL:
            self.cache.drop(session.session_id)
        else:
            self.cache.put(session)

    async def _view(self, session_id: str) -> Session:
        """The session as this engine last saw it (the cache), or as stored when it is not cached. It
        may be behind the store; a unit built on it says so (see `_commit_unit`)."""
        cached = self.cache.get(session_id)
        if cached is not None:
            return cached
        session = await asyncio.to_thread(self.store.get, session_id)
        self._remember(session)
        return session

    async def _checked(self, session_id: str, expected: int | None, *, fresh: bool = False) -> Session:
        """The view a request starts from; read afresh when it is not at the version the caller expects
        (the caller may have seen a version another process wrote), or when the step asks the policy
        (whose prompt should show every step so far; the call costs far more than the read)."""
        session = await self._view(session_id)
        if fresh or (expected is not None and session.state_version != expected):
            session = await self.session(session_id)
        return session

    async def _guarded(
        self, session: Session, tool: str, subgoal_id: str | None, masked: Collection[str]
    ) -> tuple[Session, StepRefusal | None]:
        """Why the tool step may not run, judged on the stored session when the view refuses it: a view
        that is behind may miss the sub-goals another process saw succeed (the guards only ever refuse
        for something missing, so a view that allows the step is never wrong to)."""
        refusal = check_tool_step(session, tool=tool, subgoal_id=subgoal_id, masked=masked)
        if refusal is not None:
            session = await self.session(session.session_id)
            refusal = check_tool_step(session, tool=tool, subgoal_id=subgoal_id, masked=masked)
        return session, refusal

    async def _exists(self, session_id: str) -> bool:
        try:
            await self._view(session_id)
        except SessionRLError:
            return False
        return True

    async def _replayed(self, session_id: str, ids: StepIds) -> Session | None:
        """The session right after the request of `ids` was first committed, or None if it never was."""
        events = await asyncio.to_thread(self.store.events, session_id)
        last = next((i for i, e in enumerate(events) if e.event_id == ids.event()), None)
        return None if last is None else fold(e.event for e in events[: last + 1])

    async def _once(self, key: str | None, run: Callable[[], Awaitable[T]]) -> T:
        """Run `run`, unless a request with the same key is in flight: then share its answer."""
        if key is None:
            return await run()
        if key in self._inflight:
            return await asyncio.shield(self._inflight[key])
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            result = await run()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # marked as retrieved: nobody may be waiting
            raise
        else:
            future.set_result(result)
            return result
        finally:
            del self._inflight[key]

    def _masked(self) -> tuple[str, ...]:
        return tuple(sorted(self.executor.masked()))

    def _visible_tools(self) -> dict[str, SkillContract]:
        """Contracts the policy is shown: every skill but the masked ones."""
        masked = self.executor.masked()
        return {name: c for name, c in self.executor.contracts.items() if name not in masked}


def _asks_policy(payload: StepPayload) -> bool:
    """Whether the step's payload leaves the plan, the tool or the reply to the policy."""
    if isinstance(payload, PlanPayload):
        return payload.plan is None
    if isinstance(payload, ToolPayload):
        return payload.result is None and payload.tool is None
    return payload.reply is None


def _check_version(session: Session, expected: int | None) -> None:
    if expected is not None and session.state_version != expected:
        raise StaleState(session.session_id, expected, session.state_version)


def _enter(session: Session, state: SessionState, ids: StepIds) -> list[Event]:
    """A state change to `state`, unless the session is there already."""
    return [] if session.state == state else [StateChanged(state=state, event_id=ids.event("enter"))]


def _seal(events: list[Event], ids: StepIds) -> list[Event]:
    """Name a unit's last event `ids.event()`, the mark a replay looks for (the others carry their role)."""
    return [*events[:-1], events[-1].model_copy(update={"event_id": ids.event()})]


def _raise_first(results: list[Session | SessionRLError]) -> Session:
    """The session after the last write, or the first error among the results."""
    for result in results:
        if isinstance(result, SessionRLError):
            raise result
    last = results[-1]
    assert isinstance(last, Session)
    return last


def _llm_record(call_id: str, purpose: str, messages: Sequence[Message], reply: PolicyReply) -> LLMCall:
    return LLMCall(
        call_id=call_id,
        purpose=purpose,
        messages=tuple(messages),
        response=reply.text,
        prompt_token_ids=reply.prompt_token_ids,
        token_ids=reply.token_ids,
        logprobs=reply.logprobs,
        policy_version=reply.policy_version,
        tokens_used=reply.tokens_used,
    )
