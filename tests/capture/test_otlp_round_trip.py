"""Export as OTLP, then import: the same session, for any session (a property test), in both encodings."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionrl.capture.export_otlp import session_spans
from sessionrl.capture.otlp import decode, encode
from sessionrl.capture.otlp_assembly import sessions_from_spans
from sessionrl.session.model import (
    Anchor,
    CallStatus,
    Claim,
    Feedback,
    FeedbackType,
    FinalOutput,
    LLMCall,
    Message,
    Plan,
    Session,
    SessionState,
    SubGoal,
    ToolCall,
    ToolRequest,
)

RENUMBERED = {"versions", "state_version", "updated_at"}
"""What an import renumbers or restamps, as for every other import of a session document."""

text = st.text(st.characters(codec="utf-8"), max_size=12)
ident = st.text("abcdefghij0123456789_-", min_size=1, max_size=10)
times = st.datetimes(min_value=datetime(2001, 1, 1), max_value=datetime(2090, 1, 1), timezones=st.just(UTC))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
json_objects = st.dictionaries(text, json_values, max_size=3)
requests = st.builds(ToolRequest, id=ident, name=ident, arguments=text)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    if role == "tool":
        return Message(role="tool", content=draw(text), tool_call_id=draw(ident))
    asked = draw(st.lists(requests, max_size=2)) if role == "assistant" else []
    return Message(role=role, content=draw(text), tool_calls=tuple(asked))


@st.composite
def llm_calls(draw: st.DrawFn, call_id: str) -> LLMCall:
    ids = draw(st.none() | st.lists(st.integers(0, 50_000), max_size=5))
    logprobs = (
        None if ids is None else draw(st.lists(st.floats(-20, 0), min_size=len(ids), max_size=len(ids)))
    )
    return LLMCall(
        call_id=call_id,
        purpose=draw(text),
        messages=tuple(draw(st.lists(messages(), max_size=3))),
        response=draw(text),
        prompt_token_ids=draw(st.none() | st.lists(st.integers(0, 50_000), max_size=5).map(tuple)),
        token_ids=None if ids is None else tuple(ids),
        logprobs=None if logprobs is None else tuple(logprobs),
        policy_version=draw(st.none() | st.integers(0, 100)),
        tokens_used=draw(st.none() | st.integers(0, 10_000)),
        started_at=draw(times),
        finished_at=draw(times),
        model=draw(st.none() | text),
        tool_calls=tuple(draw(st.lists(requests, max_size=2))),
        usage=draw(st.none() | st.dictionaries(ident, st.integers(0, 10_000), max_size=3)),
        latency_ms=draw(st.floats(0, 1e6)),
        status=draw(st.sampled_from(CallStatus)),
        error_message=draw(st.none() | text),
        recorded=draw(st.booleans()),
    )


@st.composite
def tool_calls(draw: st.DrawFn, call_id: str) -> ToolCall:
    return ToolCall(
        call_id=call_id,
        subgoal_id=draw(st.none() | ident),
        tool=draw(ident),
        params=draw(json_objects),
        output=draw(json_values),
        status=draw(st.sampled_from(CallStatus)),
        error_code=draw(st.none() | text),
        error_message=draw(st.none() | text),
        retryable=draw(st.booleans()),
        latency_ms=draw(st.floats(0, 1e6)),
        attempt=draw(st.integers(1, 5)),
        warnings=tuple(draw(st.lists(text, max_size=2))),
        started_at=draw(times),
        finished_at=draw(times),
        recorded=draw(st.booleans()),
        free_form=draw(st.booleans()),
    )


@st.composite
def sessions(draw: st.DrawFn) -> Session:
    ids = draw(st.lists(ident, unique=True, max_size=6))
    split = draw(st.integers(0, len(ids)))
    tools = [draw(tool_calls(f"t-{i}")) for i in ids[:split]]
    llms = [draw(llm_calls(f"l-{i}")) for i in ids[split:]]
    anchors = [
        Anchor(),
        *(Anchor(call_id=t.call_id) for t in tools),
        *(Anchor(call_id=c.call_id) for c in llms),
    ]
    feedback = [
        Feedback(
            feedback_id=f"f{n}",
            type=draw(st.sampled_from(FeedbackType)),
            score=draw(st.none() | st.floats(-5, 5)),
            comment=draw(st.none() | text),
            annotator=f"annotator-{n}",  # one item per source, so none replaces another
            anchor=draw(st.sampled_from(anchors) | st.builds(Anchor, at=times)),
            occurred_at=draw(times),
            received_at=draw(times),
            data=draw(json_objects),
        )
        for n in range(draw(st.integers(0, 3)))
    ]
    goals = tuple(
        SubGoal(id=g, description=draw(text)) for g in draw(st.lists(ident, unique=True, max_size=2))
    )
    output = draw(
        st.none()
        | st.builds(
            FinalOutput, text=text, claims=st.lists(st.builds(Claim, text=text), max_size=1).map(tuple)
        )
    )
    created = draw(times)
    return Session(
        session_id=draw(ident),
        trace_id=draw(st.binary(min_size=16, max_size=16).filter(any)).hex(),
        state=draw(st.sampled_from(SessionState)),
        scenario=draw(st.none() | text),
        tags=tuple(draw(st.lists(text, max_size=2))),
        user_id=draw(st.none() | text),
        user_query=draw(text),
        metadata=draw(json_objects),
        plan=draw(st.none() | st.just(Plan(root_goal="goal", subgoals=goals))),
        tool_calls=tuple(tools),
        llm_calls=tuple(llms),
        feedback=tuple(feedback),
        final_output=output,
        created_at=created,
        updated_at=created,
    )


def content(session: Session) -> dict[str, Any]:
    return session.model_dump(mode="json", exclude=RENUMBERED)


@given(session=sessions(), json=st.booleans())
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_export_then_import_gives_the_same_session(session: Session, json: bool) -> None:
    decoded = decode(encode(session_spans(session), json=json), json=json)
    assert decoded.problems == []
    built = sessions_from_spans(decoded.spans)
    assert built.warnings == []
    (back,) = built.sessions
    assert content(back) == content(session)
