"""The session orchestrator: opens sessions, runs plan / tool / LLM steps, takes feedback, finishes.

Every change is an event committed to the store before the call returns, so whatever the engine
acknowledged survives a crash. Steps of different kinds run in their own lanes (see `lanes`).

How a unit of events is committed, raced, retried and replayed is `writer`'s part; the events each
step writes are built in `units`. The engine decides what runs: guards, policy calls and tools.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

from pydantic import BaseModel

from sessionrl.errors import InvalidEvent, InvalidTransition
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.guards import StepRefusal, check_tool_step
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
    same_create,
    same_feedback,
    same_output,
    same_request,
    written_as_built,
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
from sessionrl.orchestrator.units import (
    enter,
    finish_unit,
    llm_record,
    plan_unit,
    ran_call,
    refused_call,
)
from sessionrl.orchestrator.writer import Build, SessionWriter, check_version, raise_first
from sessionrl.session.events import (
    Event,
    FeedbackAdded,
    LLMCallRecorded,
    SessionPatched,
    ToolCallRecorded,
    created,
)
from sessionrl.session.lifecycle import ACTIVE, TERMINAL
from sessionrl.session.model import (
    CallStatus,
    Feedback,
    FinalOutput,
    Message,
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
        self.writer = SessionWriter(store, self.config)
        self.cache = self.writer.cache
        self.committer = self.writer.committer
        self.lanes = {
            StepKind.PLAN: Lane("plan", self.config.plan_lane),
            StepKind.TOOL: Lane("tool", self.config.tool_lane),
            StepKind.LLM: Lane("llm", self.config.llm_lane),
        }
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
        await self.writer.aclose()

    # public API

    async def init_session(self, create: SessionCreate | str, *, key: str | None = None) -> str:
        """Open a session (a `SessionCreate`, or just the user's query) and return its id."""
        if isinstance(create, str):
            create = SessionCreate(user_query=create)
        ids = self._ids.ids(key)
        if create.session_id is not None and await self.writer.exists(create.session_id):
            if key is not None and await self._created_by(create.session_id, create, key, ids):
                return create.session_id
            state = (await self.session(create.session_id)).state
            raise InvalidTransition(create.session_id, state, "session_created")
        event = created(create, event_id=ids.event())
        (result,) = await self.committer.commit([(event.session_id, event, None)])
        if isinstance(result, InvalidEvent) and result.field == "event_id" and key is not None:
            raise KeyReused(key, "a create naming another session") from result
        session = raise_first([result])
        if key is not None and session.session_id != event.session_id:  # the store held the key's create
            await self._created_by(session.session_id, create, key, ids)
        self.writer.remember(session)
        return session.session_id

    async def _created_by(self, session_id: str, create: SessionCreate, key: str, ids: StepIds) -> bool:
        """Whether the keyed request of `ids` created `session_id`; `KeyReused` when it did, from another
        body than `create`."""
        first = await self.writer.logged(session_id, ids)
        if first is None:
            return False
        if not same_create(first[1], create):
            raise KeyReused(key, "a create with another body")
        return True

    async def session(self, session_id: str) -> Session:
        """The session's current read view, as stored (another process may have written it since this
        engine last did); the cache is brought up to date with it."""
        return await self.writer.session(session_id)

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
        return await self.writer.once(
            in_flight(key, kind.value, typed),
            lambda: self._step(session_id, kind, typed, ids, key, expected_version),
        )

    async def inject_feedback(
        self, session_id: str, feedback: Feedback, *, key: str | None = None
    ) -> FeedbackResult:
        """Record feedback (accepted in every state). With `key`, the feedback id is derived from it."""
        ids = self._ids.ids(key)
        if key is not None:
            feedback = feedback.model_copy(update={"feedback_id": ids.feedback()})
        event = FeedbackAdded(feedback=feedback, event_id=ids.event())

        async def run() -> FeedbackResult:
            if key is not None:  # a retry is answered from the log; another body under the key is refused
                first = await self.writer.logged(session_id, ids)
                if first is not None:
                    if not same_feedback(first[1], feedback):
                        raise KeyReused(key, "feedback with another body")
                    return feedback_result(first[0], feedback.feedback_id)
            session = await self.writer.commit(session_id, lambda _: [event], ids)
            return feedback_result(session, feedback.feedback_id)

        return await self.writer.once(in_flight(key, "feedback", feedback, ARRIVAL), run)

    async def finish(
        self,
        session_id: str,
        output: FinalOutput | str,
        *,
        key: str | None = None,
        expected_version: int | None = None,
        reason: str | None = None,
    ) -> FinishResult:
        """Give the final output and close the session, running the finishing guards.

        Every sub-goal that no tool call executed earns a `hallucination_penalty` anchored to it; claims
        citing calls the session does not have earn one `provenance_flag` naming them. `reason` says what
        ended the session (such as the gateway's `idle`); it is recorded as the state change's reason and
        as the session's `finished_by` metadata.
        """
        if isinstance(output, str):
            output = FinalOutput(text=output)
        ids = self._ids.ids(key)
        final = output

        def unit(s: Session) -> list[Event]:
            return finish_unit(s, final, ids, penalty=self.config.hallucination_penalty, reason=reason)

        async def run() -> FinishResult:
            session = await self.writer.checked(session_id, expected_version)
            if key is not None and session.state in TERMINAL:
                replayed = await self._finished_by(session_id, final, key, ids)
                if replayed is not None:
                    return replayed
            check_version(session, expected_version)
            try:
                committed = await self.writer.commit(session_id, unit, ids)
            except InvalidTransition:  # the view was behind: another process may have run this request
                replayed = None if key is None else await self._finished_by(session_id, final, key, ids)
                if replayed is None:
                    raise
                return replayed
            return finish_result(committed)

        return await self.writer.once(in_flight(key, "finish", final), run)

    async def _finished_by(
        self, session_id: str, output: FinalOutput, key: str, ids: StepIds
    ) -> FinishResult | None:
        """The first answer of the keyed finish of `ids`, None if it never ran; `KeyReused` when it gave
        another output than `output`."""
        first = await self.writer.logged(session_id, ids)
        if first is None:
            return None
        if not same_output(first[1], output):
            raise KeyReused(key, "a finish with another output")
        return finish_result(first[0])

    async def patch(self, session_id: str, patch: SessionPatch, *, key: str | None = None) -> Session:
        """Change a session's scenario, tags or metadata (accepted in every state); return the session."""
        ids = self._ids.ids(key)
        event = SessionPatched(patch=patch, event_id=ids.event())
        return await self.writer.once(key, lambda: self.writer.commit(session_id, lambda _: [event], ids))

    def route(self, session_id: str) -> PolicyBackend:
        """The backend that serves `session_id` (the same one every time, for its prompt cache)."""
        if not self.backends:
            raise PolicyError("no policy backend is configured", retryable=False)
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
        session = await self.writer.checked(session_id, expected_version, fresh=_asks_policy(payload))
        if key is not None and may_be_replay(session, kind, ids, payload):
            replayed = await self.writer.replayed(session_id, ids)
            if replayed is not None:
                if not same_request(kind, payload, replayed, *call_ids(payload, ids)):
                    raise KeyReused(key, "a different request (another kind or body)")
                return replayed_result(kind, replayed, ids, self._masked(), payload)
        check_version(session, expected_version)
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
                LLMCallRecorded(call=llm_record(ids.llm, "plan", messages, reply), event_id=ids.event("llm"))
            )
            plan = parse_plan(reply.text)
        chosen = plan
        unit: Build = (
            (lambda _: before)
            if chosen is None
            else (
                lambda s: [
                    *before,
                    *plan_unit(
                        s,
                        chosen,
                        ids,
                        by_policy=bool(before),
                        known_tools=self.executor.contracts.keys(),
                        config=self.config,
                    ),
                ]
            )
        )
        return plan_result(await self.writer.commit(session.session_id, unit, ids), ids, self._masked())

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
                LLMCallRecorded(call=llm_record(ids.llm, "act", messages, reply), event_id=ids.event("llm"))
            )
            choice = parse_tool_call(reply.text)
            if choice is None:
                return tool_result(
                    await self.writer.commit(session.session_id, lambda _: before, ids), ids, self._masked()
                )
            tool, params, subgoal_id = choice.tool, choice.params, choice.subgoal_id or subgoal_id
        call_id = payload.call_id or ids.call
        session, refusal = await self._guarded(session, tool, subgoal_id, self.executor.masked())
        if refusal is None:
            call = await self._run_tool(call_id, tool, params, subgoal_id)
        else:
            call = refused_call(call_id, tool, params, subgoal_id, refusal)
        record = ToolCallRecorded(call=call, event_id=ids.event("call"))

        def unit(s: Session) -> list[Event]:
            return [*enter(s, SessionState.EXECUTING, ids), *before, record]

        return tool_result(
            await self.writer.commit(session.session_id, unit, ids), ids, self._masked(), call_id
        )

    async def _run_tool(
        self, call_id: str, tool: str, params: dict[str, Any], subgoal_id: str | None
    ) -> ToolCall:
        async with self.lanes[StepKind.TOOL].slot():
            started = utcnow()
            result = await self.executor.call(tool, params)
            finished = utcnow()
        return ran_call(call_id, params, subgoal_id, result, started, finished)

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
            return [*enter(s, SessionState.EXECUTING, ids), record]

        committed = await self.writer.commit(session.session_id, unit, ids)
        if not written_as_built(committed.tool_call(call_id), call):
            raise KeyReused(None, "another tool call, recorded first under the same key")
        return tool_result(committed, ids, self._masked(), call_id)

    async def _llm(self, session: Session, payload: LLMPayload, ids: StepIds) -> StepResult:
        call_id = payload.call_id or ids.llm
        if payload.reply is not None:
            recorded = LLMCallRecorded(
                call=recorded_llm_call(session, payload, call_id), event_id=ids.event("llm")
            )
            committed = await self.writer.commit(session.session_id, lambda _: [recorded], ids)
            stored = next((c for c in reversed(committed.llm_calls) if c.call_id == call_id), None)
            if not written_as_built(stored, recorded.call):
                raise KeyReused(None, "another model call, recorded first under the same key")
            return llm_result(committed, ids, self._masked(), call_id)
        messages = payload.messages or (Message(role="user", content=session.user_query),)
        reply = await self._ask(session, messages, StepKind.LLM, payload.purpose)
        if isinstance(reply, StepResult):
            return reply
        record = LLMCallRecorded(
            call=llm_record(call_id, payload.purpose, messages, reply), event_id=ids.event("llm")
        )
        return llm_result(
            await self.writer.commit(session.session_id, lambda _: [record], ids),
            ids,
            self._masked(),
            call_id,
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
                retryable=exc.retryable,
                masked=self._masked(),
            )

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

    def _masked(self) -> tuple[str, ...]:
        return tuple(sorted(self.executor.masked()))

    def _visible_tools(self) -> dict[str, SkillContract]:
        """Contracts the policy is shown: every skill but the masked ones."""
        masked = self.executor.masked()
        return {name: c for name, c in self.executor.contracts.items() if name not in masked}


ARRIVAL = frozenset({"feedback_id", "received_at", "occurred_at"})
"""Fields of feedback that a retry of the same request may change (see `recording.same_feedback`)."""


def in_flight(
    key: str | None, kind: str, body: BaseModel, exclude: frozenset[str] = frozenset()
) -> str | None:
    """The key under which a request waits for a concurrent one (`SessionWriter.once`): its idempotency
    key and a digest of its body, so only the same request shares an answer; another body under the key
    runs on its own, and is refused as the first one's replay (`KeyReused`)."""
    if key is None:
        return None
    encoded = body.model_dump_json(exclude=set(exclude)).encode()
    return f"{key} {kind} {hashlib.blake2b(encoded, digest_size=12).hexdigest()}"


def _asks_policy(payload: StepPayload) -> bool:
    """Whether the step's payload leaves the plan, the tool or the reply to the policy."""
    if isinstance(payload, PlanPayload):
        return payload.plan is None
    if isinstance(payload, ToolPayload):
        return payload.result is None and payload.tool is None
    return payload.reply is None
