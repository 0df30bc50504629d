"""Property-based API testing against the served OpenAPI document: no 5xx, every answer as documented.

Schemathesis generates requests for every operation from the schema (valid and invalid ones) and checks
each response: its status is documented, its content type, headers and body match the schema, and it is
not a server error. The app runs in process (ASGI) over an in-memory store. Every other request is sent
to a real session (a fresh one every ten), so steps, feedback and finishes also meet live sessions
rather than only unknown ids.

One check is left out: `negative_data_rejection`. Every request here carries a valid token (so a case
meant to lack `Authorization` still has it) and unknown query parameters are ignored by design, so that
check would report requests the service is right to serve.
"""

from __future__ import annotations

import itertools

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.python import asgi
from service_support import AUTH, make_app

from sessionrl.gateway import ChatReply, ScriptedChat

APP = make_app(chat=ScriptedChat(lambda request: ChatReply(text="ok")), rate_per_s=1e9, rate_burst=10**9)
CONFIG = schemathesis.Config.from_dict(
    {
        "checks": {
            "negative_data_rejection": {"enabled": False},
            # a valid request may still meet a session in another state: 409, or 412 under If-Match
            "positive_data_acceptance": {
                "expected-statuses": ["2xx", "401", "403", "404", "409", "412", "429"]
            },
        },
        "operations": [
            {
                # registering a version loads its artifact first: a well-formed path to no model is a 422
                "include-path": "/v1/policies/{policy}/versions",
                "include-method": "POST",
                "checks": {
                    "positive_data_acceptance": {
                        "expected-statuses": ["2xx", "401", "403", "404", "409", "412", "422", "429"]
                    }
                },
            }
        ],
    }
)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP, config=CONFIG)
COUNTER = itertools.count()


def live_session(n: int) -> str:
    """The id of the live session for request `n`, opened over HTTP on first use (a repeat is a replay)."""
    sid = f"live-{n // 20}"
    with asgi.get_client(APP) as client:
        response = client.post(
            "/v1/sessions",
            json={"user_query": "q", "session_id": sid},
            headers={**AUTH, "Idempotency-Key": f"seed-{sid}"},
        )
    assert response.status_code == 201, response.text
    return sid


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_every_operation_answers_as_documented(case: schemathesis.Case) -> None:
    n = next(COUNTER)
    if case.path_parameters and "session_id" in case.path_parameters and n % 2 == 0:
        case.path_parameters["session_id"] = live_session(n)
        if isinstance(case.body, dict) and isinstance(case.body.get("anchor"), dict):
            # a live session has no calls or sub-goals, so an anchor naming one is rightly a 422 that the
            # schema cannot express; the feedback is kept, about the whole session
            case.body["anchor"] = {}
    if isinstance(case.body, dict):
        within_rules_across_fields(case.body)
    if case.headers and "Idempotency-Key" in case.headers:
        # generated keys repeat across cases with other bodies, which is rightly a 422 (a key names one
        # request); a key of its own per case keeps each case the request it was generated as
        case.headers["Idempotency-Key"] = f"case-{n}"
    case.call_and_validate(headers=AUTH)


def within_rules_across_fields(body: dict[str, object]) -> None:
    """Bring a generated body within the rules that tie one field to another, which the schema states in
    words only (and which have their own tests): a recorded tool call names its tool, log-probabilities
    come with as many token ids, a human rating is from 1 to 5, and a chat request's messages come in an
    order OpenAI takes, with `tool_choice` and `stream_options` only where tools and streaming are."""
    payload = body.get("payload")
    if isinstance(payload, dict):
        if payload.get("result") is not None and payload.get("tool") is None:
            payload["result"] = None
        if isinstance(payload.get("reply"), dict):
            payload["reply"]["logprobs"] = None
    if isinstance(body.get("messages"), list):  # a chat request: OpenAI's rules on order and pairs
        body["messages"] = [{"role": "user", "content": "hi"}]
        if isinstance(body.get("tool_choice"), dict) or not body.get("tools"):
            body["tool_choice"] = None
        if not body.get("stream"):
            body["stream_options"] = None
    score = body.get("score")
    if body.get("type") == "human_rating" and isinstance(score, int | float) and not 1 <= score <= 5:
        body["score"] = 3
