"""OTLP spans to sessions: the GenAI and OpenInference mappings, decoding, grouping and the file import."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otlp_support import ANSWER, ARGS, QUESTION, RESULT, TRACE, genai_trace, openinference_trace, span
from sessionrl.capture.otlp import BadPayload, decode, encode
from sessionrl.capture.otlp_assembly import group_keys, sessions_from_spans
from sessionrl.capture.otlp_import import read_otlp
from sessionrl.session.model import CallStatus, FeedbackType, Session, SessionState


def one_session(spans: list) -> Session:  # type: ignore[type-arg]
    built = sessions_from_spans(spans)
    assert built.warnings == []
    (session,) = built.sessions
    return session


def test_genai_spans_become_llm_and_tool_calls() -> None:
    s = one_session(genai_trace())
    assert (s.session_id, s.trace_id, s.state) == (f"otel-{TRACE}", TRACE, SessionState.FINISHED)
    assert s.user_query == QUESTION
    assert s.metadata["token_ids"].startswith("none in the trace: training re-tokenises")
    first, second = s.llm_calls
    assert first.call_id == "a000000000000002"
    assert [(m.role, m.content) for m in first.messages] == [("user", QUESTION)]
    assert [(t.id, t.name, orjson.loads(t.arguments)) for t in first.tool_calls] == [
        ("call_1", "order_status", ARGS)
    ]
    assert first.usage == {"prompt_tokens": 11, "completion_tokens": 5}
    assert first.tokens_used == 16
    assert first.model == "fake-1"
    assert first.latency_ms == pytest.approx(19.0)
    assert [m.role for m in second.messages] == ["user", "assistant", "tool"]
    assert second.messages[2].tool_call_id == "call_1"
    assert orjson.loads(second.messages[2].content) == RESULT
    assert second.response == ANSWER
    (tool,) = s.tool_calls
    assert (tool.call_id, tool.tool, tool.params, tool.output, tool.status) == (
        "call_1", "order_status", ARGS, RESULT, CallStatus.SUCCESS
    )  # fmt: skip
    assert tool.recorded
    assert tool.free_form
    assert s.final_output is not None
    assert s.final_output.text == ANSWER


def test_an_evaluation_event_is_feedback_on_its_call() -> None:
    (rating,) = one_session(genai_trace()).feedback
    assert rating.type is FeedbackType.AUTO_VALIDATION
    assert (rating.score, rating.comment, rating.annotator) == (0.9, "answers the question", "helpfulness")
    assert rating.anchor.call_id == "a000000000000004"


def test_a_failed_tool_span_is_a_failed_tool_call() -> None:
    (tool,) = one_session(genai_trace(tool_fails=True)).tool_calls
    assert (tool.status, tool.error_code, tool.error_message, tool.output) == (
        CallStatus.ERROR, "TimeoutError", "timed out", None
    )  # fmt: skip


def test_openinference_spans_map_like_genai_ones() -> None:
    genai, oi = one_session(genai_trace()), one_session(openinference_trace())

    def content(s: Session) -> list[object]:
        calls = [(c.messages, c.response, c.tool_calls, c.model, c.tokens_used) for c in s.llm_calls]
        tools = [(t.call_id, t.tool, t.params, t.output, t.status) for t in s.tool_calls]
        return [s.user_query, calls, tools, s.final_output, s.state]

    assert content(oi) == content(genai)
    assert oi.metadata["conventions"] == ["openinference"]


def test_protobuf_and_json_read_the_same_spans() -> None:
    spans = genai_trace()
    from_proto = decode(encode(spans, json=False), json=False).spans
    from_json = decode(encode(spans, json=True), json=True).spans
    assert from_proto == from_json
    assert [dataclasses.replace(s, where="") for s in from_proto] == spans


def test_otlp_json_spells_ids_in_hex() -> None:
    doc = orjson.loads(encode(genai_trace()[:1], json=True))
    first = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert first["traceId"] == TRACE
    assert first["spanId"] == "a000000000000001"


def test_a_truncated_protobuf_is_a_bad_payload_naming_the_body() -> None:
    body = encode(genai_trace(), json=False)
    with pytest.raises(BadPayload) as caught:
        decode(body[: len(body) // 2], json=False)
    assert caught.value.problems[0][0] == "body"


def test_a_span_without_trace_id_is_refused_and_the_others_kept() -> None:
    spans = genai_trace()
    doc = orjson.loads(encode(spans, json=True))
    del doc["resourceSpans"][0]["scopeSpans"][0]["spans"][2]["traceId"]
    decoded = decode(orjson.dumps(doc), json=True)
    assert [s.span_id for s in decoded.spans] == [spans[i].span_id for i in (0, 1, 3)]
    assert decoded.problems == [
        (
            "resourceSpans[0].scopeSpans[0].spans[2].traceId",
            "missing (empty or all zero): every span needs one",
        )
    ]
    with pytest.raises(BadPayload):
        decode(orjson.dumps(doc), json=True, strict=True)


def test_ids_that_are_not_hex_are_a_bad_payload() -> None:
    doc = orjson.loads(encode(genai_trace()[:1], json=True))
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = "zz"
    with pytest.raises(BadPayload, match=r"spans\[0\]\.spanId: expected hex digits"):
        decode(orjson.dumps(doc), json=True)


def test_grouping_by_an_attribute_joins_traces_and_their_unmarked_spans() -> None:
    first = genai_trace("1" * 32)
    second = genai_trace("2" * 32)
    marked = [dataclasses.replace(s, attributes={**s.attributes, "session.id": "chat-7"}) for s in first[:2]]
    marked += first[2:]
    marked += [dataclasses.replace(second[0], attributes={"session.id": "chat-7"}), *second[1:]]
    assert set(group_keys(marked, "session.id", {})) == {"attr:chat-7"}
    assert set(group_keys(marked, None, {})) == {f"trace:{'1' * 32}", f"trace:{'2' * 32}"}
    built = sessions_from_spans(marked, group_by="session.id")
    (session,) = built.sessions
    assert session.session_id == "otel-chat-7"
    assert len(session.llm_calls) == 2  # the second trace's spans share span ids with the first's


def test_calls_are_ordered_by_start_time_whatever_the_span_order() -> None:
    spans = genai_trace()
    assert one_session(spans[::-1]).llm_calls == one_session(spans).llm_calls


def test_import_warns_of_a_missing_parent_and_keeps_the_span(tmp_path: object) -> None:
    spans = genai_trace()
    orphan = dataclasses.replace(spans[2], parent_span_id="ffffffffffffffff")
    read = read_otlp(encode([spans[0], spans[1], orphan, spans[3]], json=True))
    assert read.problems == []
    (warning,) = read.warnings
    assert warning.field == "resourceSpans[0].scopeSpans[0].spans[2]"
    assert "parent ffffffffffffffff is not in the file" in warning.rule
    (_, raw) = read.records[0]
    doc = orjson.loads(raw)
    assert [c["tool"] for c in doc["tool_calls"]] == ["order_status"]
    assert "parent ffffffffffffffff" in doc["metadata"]["otlp_warnings"][0]


def test_import_reports_an_unreadable_line_and_reads_the_others() -> None:
    good = encode(genai_trace(), json=True)
    read = read_otlp(good + b"\n" + good[:40] + b"\n")
    assert [(p.line, p.field) for p in read.problems] == [(2, "body")]
    assert len(read.records) == 1


def test_a_root_less_file_still_imports_with_a_warning_in_the_session() -> None:
    built = sessions_from_spans(genai_trace()[1:])
    (session,) = built.sessions
    assert session.state is SessionState.FINISHED
    assert any("a000000000000001 is not in the file" in w for w in session.metadata["otlp_warnings"])


def test_spans_built_here_are_what_the_support_module_says() -> None:
    # guard against the fixture drifting: a plain span with no conventions maps to no call
    assert sessions_from_spans([span("c000000000000001", None, "work", {}, 0, 1)]).sessions[0].llm_calls == ()


def test_an_evaluation_span_is_feedback_on_its_parents_call() -> None:
    judged = span(
        "a000000000000009",
        "a000000000000004",
        "evaluate",
        {
            "gen_ai.evaluation.name": "relevance",
            "gen_ai.evaluation.score.value": 1,
            "gen_ai.evaluation.score.label": "relevant",
        },
        85,
        86,
    )
    feedback = {f.annotator: f for f in one_session([*genai_trace(), judged]).feedback}
    assert feedback["relevance"].anchor.call_id == "a000000000000004"
    assert (feedback["relevance"].score, feedback["relevance"].data) == (1.0, {"label": "relevant"})


def test_import_leaves_out_a_span_with_unusable_values_and_warns() -> None:
    spans = genai_trace()
    odd = dataclasses.replace(spans[2], attributes={**spans[2].attributes, "sessionrl.status": "maybe"})
    built = sessions_from_spans([spans[0], spans[1], odd, spans[3]])
    ((_, rule, kind),) = built.warnings
    assert kind == "unusable_span"
    assert rule.startswith("span a000000000000003 (execute_tool order_status) left out")
    (session,) = built.sessions
    assert (len(session.llm_calls), len(session.tool_calls)) == (2, 0)


BODY = encode(genai_trace(), json=False)


@given(flips=st.lists(st.tuples(st.integers(0, len(BODY) - 1), st.integers(0, 255)), min_size=1, max_size=4))
@settings(max_examples=150, deadline=None)
def test_a_corrupt_body_is_a_bad_payload_or_spans_that_assemble(flips: list[tuple[int, int]]) -> None:
    body = bytearray(BODY)
    for where, value in flips:
        body[where] = value
    try:
        decoded = decode(bytes(body), json=False)
    except BadPayload:
        return
    sessions_from_spans(decoded.spans)  # whatever was read maps, or is warned about: nothing raises
