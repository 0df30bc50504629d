"""`POST /v1/traces`: OTLP over HTTP into sessions, with the service's auth and limits, and the receiver's
assembly across requests (any order, duplicates, idle finish, late spans)."""

from __future__ import annotations

import dataclasses
import gzip
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from service_support import READER, make_app, serving

from otlp_support import ANSWER, TRACE, genai_trace, openinference_trace
from sessionrl.capture.export_otlp import session_spans
from sessionrl.capture.otlp import decode, encode
from sessionrl.capture.otlp_config import TracesConfig
from sessionrl.capture.otlp_receiver import TraceReceiver
from sessionrl.capture.otlp_spans import Span
from sessionrl.session.model import Session, SessionState
from sessionrl.store import SessionStore
from sessionrl.store.synthetic import ingest

PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}
SID = f"otel-{TRACE}"


@pytest.fixture
async def traces() -> AsyncIterator[httpx.AsyncClient]:
    async with serving(make_app(traces=TracesConfig(root_grace_s=0))) as connected:
        yield connected


async def post(client: httpx.AsyncClient, spans: list[Span], *, json: bool = False) -> httpx.Response:
    return await client.post(
        "/v1/traces", content=encode(spans, json=json), headers=JSON if json else PROTOBUF
    )


def rejected(response: httpx.Response) -> tuple[int, str]:
    reply = ExportTraceServiceResponse.FromString(response.content)
    return reply.partial_success.rejected_spans, reply.partial_success.error_message


async def session(client: httpx.AsyncClient, sid: str = SID) -> dict[str, Any]:
    got = await client.get(f"/v1/sessions/{sid}")
    assert got.status_code == 200, got.text
    return dict(got.json())


async def test_genai_spans_sent_as_protobuf_become_a_finished_session(traces: httpx.AsyncClient) -> None:
    answer = await post(traces, genai_trace())
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/x-protobuf"
    assert rejected(answer) == (0, "")
    s = await session(traces)
    assert s["state"] == "finished"
    assert [len(s["llm_calls"]), len(s["tool_calls"]), len(s["feedback"])] == [2, 1, 1]
    assert s["tool_calls"][0]["output"] == {"status": "packed"}
    assert s["final_output"]["text"] == ANSWER


async def test_openinference_spans_sent_as_json_are_answered_in_json(traces: httpx.AsyncClient) -> None:
    answer = await post(traces, openinference_trace(), json=True)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {}
    s = await session(traces)
    assert [c["tool"] for c in s["tool_calls"]] == ["order_status"]
    assert s["llm_calls"][1]["response"] == ANSWER


def content(s: dict[str, Any]) -> dict[str, Any]:
    return {k: s[k] for k in ("user_query", "llm_calls", "tool_calls", "feedback", "final_output", "state")}


@pytest.mark.parametrize("order", [[3, 2, 1, 0], [1, 3, 2, 0], [2, 3, 1, 0]])
async def test_spans_over_several_requests_in_any_order_make_the_same_session(order: list[int]) -> None:
    spans = genai_trace()
    async with serving(make_app(traces=TracesConfig(root_grace_s=0))) as whole:
        await post(whole, spans)
        expected = content(await session(whole))
    async with serving(make_app(traces=TracesConfig(root_grace_s=0))) as pieces:
        for i in order:  # one span per request
            assert rejected(await post(pieces, [spans[i]])) == (0, "")
        assert content(await session(pieces)) == expected


async def test_a_repeated_request_stores_nothing_new(traces: httpx.AsyncClient) -> None:
    await post(traces, genai_trace()[1:3])
    before = await session(traces)
    assert rejected(await post(traces, genai_trace()[1:3])) == (0, "")
    assert (await session(traces))["state_version"] == before["state_version"]
    await post(traces, genai_trace())
    finished = await session(traces)
    assert rejected(await post(traces, genai_trace())) == (0, "")  # all of it again, after the finish
    assert (await session(traces))["state_version"] == finished["state_version"]


async def test_a_new_call_after_the_finish_is_refused_and_said_why(traces: httpx.AsyncClient) -> None:
    await post(traces, genai_trace())
    late = dataclasses.replace(genai_trace()[1], span_id="a0000000000000ff")
    count, message = rejected(await post(traces, [late]))
    assert count == 1
    assert "a0000000000000ff" in message
    assert "finished" in message
    assert len((await session(traces))["llm_calls"]) == 2


async def test_a_truncated_protobuf_is_a_400_and_nothing_is_written(traces: httpx.AsyncClient) -> None:
    body = encode(genai_trace(), json=False)
    answer = await traces.post("/v1/traces", content=body[:-7], headers=PROTOBUF)
    assert answer.status_code == 400
    problem = answer.json()
    assert problem["code"] == "bad_traces"
    assert "not an OTLP protobuf ExportTraceServiceRequest" in problem["detail"]
    assert (await traces.get(f"/v1/sessions/{SID}")).status_code == 404


async def test_malformed_json_is_a_400_naming_it(traces: httpx.AsyncClient) -> None:
    answer = await traces.post("/v1/traces", content=b'{"resourceSpans": [', headers=JSON)
    assert answer.status_code == 400
    assert "malformed JSON" in answer.json()["detail"]


async def test_a_span_without_trace_id_is_refused_and_the_rest_stored(traces: httpx.AsyncClient) -> None:
    doc = orjson.loads(encode(genai_trace(), json=True))
    del doc["resourceSpans"][0]["scopeSpans"][0]["spans"][2]["traceId"]
    answer = await traces.post("/v1/traces", content=orjson.dumps(doc), headers=JSON)
    assert answer.status_code == 200
    assert answer.json()["partialSuccess"]["rejectedSpans"] == "1"
    assert "spans[2].traceId: missing" in answer.json()["partialSuccess"]["errorMessage"]
    s = await session(traces)
    assert (len(s["llm_calls"]), len(s["tool_calls"])) == (2, 0)


async def test_a_gzipped_body_is_read(traces: httpx.AsyncClient) -> None:
    body = gzip.compress(encode(genai_trace(), json=False))
    answer = await traces.post("/v1/traces", content=body, headers={**PROTOBUF, "Content-Encoding": "gzip"})
    assert answer.status_code == 200
    assert (await session(traces))["state"] == "finished"


async def test_the_route_keeps_the_services_auth_and_limits() -> None:
    app = make_app(traces=TracesConfig(root_grace_s=0), max_body_bytes=1024)
    async with serving(app) as client:
        body = encode(genai_trace(), json=False)
        assert len(body) > 1024
        assert (await client.post("/v1/traces", content=body, headers=PROTOBUF)).status_code == 413
        small = encode(genai_trace()[:1], json=False)
        anonymous = {**PROTOBUF, "Authorization": ""}
        assert (await client.post("/v1/traces", content=small, headers=anonymous)).status_code == 401
        reader = {**PROTOBUF, "Authorization": f"Bearer {READER}"}
        assert (await client.post("/v1/traces", content=small, headers=reader)).status_code == 403
        text = {"Content-Type": "text/plain"}
        assert (await client.post("/v1/traces", content=small, headers=text)).status_code == 415


def receiver(store: SessionStore, clock: list[float], **config: Any) -> TraceReceiver:
    return TraceReceiver(store, TracesConfig(**config), clock=lambda: clock[0])


def stored(store: SessionStore, sid: str = SID) -> Session:
    return store.get(sid)


def test_a_session_without_its_root_is_finished_when_idle_and_says_so() -> None:
    clock = [0.0]
    with SessionStore.open("sqlite://") as store:
        r = receiver(store, clock, idle_finish_s=60)
        r.ingest(decode(encode(genai_trace()[1:], json=False), json=False))
        assert r.sweep() == []
        assert stored(store).state is SessionState.CREATED
        clock[0] = 61.0
        assert r.sweep() == [SID]
        s = stored(store)
        assert s.state is SessionState.FINISHED
        assert s.metadata["otlp_warnings"][0] == "no root span came: finished when spans stopped coming"
        assert r.open_sessions == 0


def test_the_root_waits_its_grace_for_spans_still_on_their_way() -> None:
    clock = [0.0]
    spans = genai_trace()
    with SessionStore.open("sqlite://") as store:
        r = receiver(store, clock, root_grace_s=2)
        r.ingest(decode(encode(spans[:1], json=False), json=False))
        clock[0] = 1.0
        assert r.sweep() == []
        for span in spans[:0:-1]:  # the children, last first
            r.ingest(decode(encode([span], json=False), json=False))
        clock[0] = 2.5
        assert r.sweep() == []  # the grace counts from the last span
        clock[0] = 3.5
        assert r.sweep() == [SID]
        s = stored(store)
        assert (s.state, len(s.llm_calls), len(s.tool_calls)) == (SessionState.FINISHED, 2, 1)
        assert [c.call_id for c in s.llm_calls] == ["a000000000000002", "a000000000000004"]  # in start order


def test_spans_grouped_by_an_attribute_across_traces_make_one_session() -> None:
    first, second = genai_trace("1" * 32), genai_trace("2" * 32)
    second = [dataclasses.replace(s, span_id="b" + s.span_id[1:]) for s in second]

    def tagged(spans: list[Span]) -> list[Span]:
        return [dataclasses.replace(s, resource={"session.id": "chat-7"}) for s in spans]

    clock = [0.0]
    with SessionStore.open("sqlite://") as store:
        r = receiver(store, clock, group_by="session.id", root_grace_s=0, idle_finish_s=30)
        r.ingest(decode(encode(tagged(first[1:]), json=False), json=False))
        r.ingest(decode(encode(tagged(second[1:]), json=False), json=False))
        clock[0] = 31.0
        assert r.sweep() == ["otel-chat-7"]
        s = stored(store, "otel-chat-7")
        assert (len(s.llm_calls), len(s.tool_calls)) == (4, 1)  # both traces' tool spans share call_1


def test_a_span_whose_parent_never_comes_is_kept_and_noted_at_the_idle_finish() -> None:
    clock = [0.0]
    spans = genai_trace()
    orphan = dataclasses.replace(spans[2], parent_span_id="ffffffffffffffff")
    with SessionStore.open("sqlite://") as store:
        r = receiver(store, clock, root_grace_s=0, idle_finish_s=30)
        done = r.ingest(decode(encode([spans[0], spans[1], orphan, spans[3]], json=False), json=False))
        assert (done.accepted, done.rejected, done.finished) == (4, 0, [])  # the root came, a parent did not
        clock[0] = 31.0
        assert r.sweep() == [SID]
        s = stored(store)
        assert [t.tool for t in s.tool_calls] == ["order_status"]
        assert s.metadata["otlp_warnings"] == [
            "no span ffffffffffffffff came, though spans name it as their parent"
        ]


async def test_an_evaluation_after_the_finish_is_still_feedback(traces: httpx.AsyncClient) -> None:
    spans = genai_trace()
    await post(traces, spans)
    late = dataclasses.replace(
        spans[1],
        events=(
            dataclasses.replace(
                spans[3].events[0],
                attributes={"gen_ai.evaluation.name": "late", "gen_ai.evaluation.score.value": 1},
            ),
        ),
    )
    assert rejected(await post(traces, [late])) == (0, "")  # its call is a duplicate, its evaluation new
    s = await session(traces)
    assert sorted(f["annotator"] for f in s["feedback"]) == ["helpfulness", "late"]


async def test_sessions_exported_as_otlp_come_back_whole_through_the_receiver(
    traces: httpx.AsyncClient,
) -> None:
    with SessionStore.open("sqlite://") as source:
        ingest(source, 6, seed=3)
        originals = list(source.iter_sessions())
    for original in originals:
        answer = await post(traces, session_spans(original))
        assert rejected(answer) == (0, "")
    renumbered = {"versions", "state_version", "updated_at"}
    for original in originals:
        back = Session.model_validate(await session(traces, original.session_id))
        assert back.model_dump(exclude=renumbered) == original.model_dump(exclude=renumbered)


def test_after_a_restart_open_sessions_are_taken_up_and_finish_when_idle(tmp_path: Path) -> None:
    clock = [0.0]
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with SessionStore.open(url) as store:
        receiver(store, clock, idle_finish_s=60).ingest(
            decode(encode(genai_trace()[1:], json=False), json=False)
        )
    with SessionStore.open(url) as store:  # the service again, with a receiver that remembers nothing
        again = receiver(store, clock, idle_finish_s=60)
        assert again.adopt() == 1
        clock[0] = 61.0
        assert again.sweep() == [SID]
        assert stored(store).state is SessionState.FINISHED


async def test_a_span_with_unusable_values_is_refused_and_the_rest_stored(traces: httpx.AsyncClient) -> None:
    spans = genai_trace()
    odd = dataclasses.replace(spans[2], attributes={**spans[2].attributes, "sessionrl.status": "maybe"})
    count, message = rejected(await post(traces, [spans[0], spans[1], odd, spans[3]]))
    assert count == 1
    assert "span a000000000000003 (execute_tool order_status)" in message
    s = await session(traces)
    assert (len(s["llm_calls"]), len(s["tool_calls"]), s["state"]) == (2, 0, "finished")


async def test_a_session_that_cannot_be_opened_refuses_its_spans(traces: httpx.AsyncClient) -> None:
    spans = [
        dataclasses.replace(s, resource={"sessionrl.session.created_at": "yesterday"}) for s in genai_trace()
    ]
    count, message = rejected(await post(traces, spans))
    assert count == 4
    assert "cannot be opened" in message
    assert (await traces.get(f"/v1/sessions/{SID}")).status_code == 404
