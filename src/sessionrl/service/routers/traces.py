"""`POST /v1/traces`: OpenTelemetry traces (OTLP over HTTP, protobuf or JSON) become sessions.

An agent's standard OTLP exporter points here (`OTEL_EXPORTER_OTLP_ENDPOINT=http://host:port`, its
token in `OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20<token>`). The route takes the bearer token
(write scope), the body limit and the rate limit of every other write route. A body that cannot be read
(a truncated protobuf, malformed JSON) is a 400 naming the problem, and nothing of it is written; spans
that can be read but not used (no trace id, say) are refused one by one, in the answer's partial
success, while the rest are stored. See `sessionrl.capture.otlp_receiver` for how sessions are built,
and docs/traces.md for the attribute mapping.

The route is left out of the OpenAPI document: OTLP is specified by OpenTelemetry's protobuf schema,
which an OpenAPI body schema cannot state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

from sessionrl.capture.otlp import BadPayload, TracesUnavailable, decode, response_bytes
from sessionrl.capture.otlp_config import TracesConfig
from sessionrl.capture.otlp_receiver import Ingested, TraceReceiver
from sessionrl.service.deps import Writer
from sessionrl.service.problems import ProblemError

log = logging.getLogger("sessionrl.service.traces")
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
SWEEP_EVERY_S = 5.0


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open the receiver over the app's store, and finish idle sessions while the app runs."""
    config: TracesConfig = app.state.config.traces
    receiver = TraceReceiver(app.state.store, config)
    await run_in_threadpool(receiver.adopt)  # sessions an earlier run left open finish when idle too
    app.state.traces = receiver
    waits = [SWEEP_EVERY_S, config.idle_finish_s / 4] + (
        [config.root_grace_s / 2] if config.root_grace_s else []
    )
    sweeper = asyncio.create_task(_sweep(receiver, min(waits)))
    try:
        yield
    finally:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper
        app.state.traces = None


async def _sweep(receiver: TraceReceiver, every_s: float) -> None:
    """Finish idle sessions every `every_s`; a failed sweep is logged and the next one tries again."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await run_in_threadpool(receiver.sweep)
        except Exception:
            log.exception("finishing idle trace sessions failed; retrying in %.1f s", every_s)


router = APIRouter(tags=["traces"], lifespan=lifespan)


@router.post("/v1/traces", include_in_schema=False)
async def receive_traces(request: Request, principal: Writer) -> Response:
    """Store the spans of an OTLP `ExportTraceServiceRequest`; answer with an `ExportTraceServiceResponse`
    (its partial success counts the spans refused and says why)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media not in (PROTOBUF, "application/protobuf", JSON):
        raise ProblemError(
            415, "unsupported_media_type", f"send {PROTOBUF} or {JSON}, not {media or 'nothing'}"
        )
    body = _inflated(await request.body(), request)
    receiver: TraceReceiver = request.app.state.traces
    done = await run_in_threadpool(_receive, receiver, body, media == JSON)
    message = "; ".join(done.reasons)
    answer = response_bytes(rejected=done.rejected, message=message, json=media == JSON)
    return Response(answer, media_type=JSON if media == JSON else PROTOBUF)


def _receive(receiver: TraceReceiver, body: bytes, json: bool) -> Ingested:
    try:
        decoded = decode(body, json=json)
    except BadPayload as exc:
        raise ProblemError(400, "bad_traces", f"nothing was stored: {exc}") from exc
    except TracesUnavailable as exc:
        raise ProblemError(501, "traces_unavailable", str(exc)) from exc
    return receiver.ingest(decoded)


def _inflated(body: bytes, request: Request) -> bytes:
    """The body, gunzipped when sent with `Content-Encoding: gzip` (held to the same size limit)."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("identity", ""):
        return body
    if encoding != "gzip":
        raise ProblemError(415, "unsupported_media_type", f"content encodings: gzip or none, not {encoding}")
    limit = request.app.state.config.max_body_bytes
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ProblemError(400, "bad_traces", f"nothing was stored: the gzip body is corrupt: {exc}") from exc
    if len(out) > limit:
        raise ProblemError(413, "too_large", f"the request body exceeds {limit} bytes once gunzipped")
    return out
