"""OTLP trace payloads to and from plain spans, through `opentelemetry-proto`'s generated classes.

`decode(body, json=...)` reads an `ExportTraceServiceRequest` sent as protobuf or as OTLP/JSON (whose
trace and span ids are hex, not base64 as protobuf's own JSON mapping would have them), checks every
span (a trace id, a span id, a parent id of the right length) and returns `Decoded`: the valid spans and
a problem for each one refused, named by its place in the payload (`resourceSpans[0].scopeSpans[0]
.spans[3].traceId`). `encode(spans, json=...)` writes spans back as a request.

The OpenTelemetry packages (the `traces` extra) are imported when a payload is first read or written,
so `import sessionrl.service` works without them; without them, `TracesUnavailable` says what to install.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import orjson

from sessionrl.capture.otlp_spans import Span, SpanEvent
from sessionrl.errors import SessionRLError

ID_FIELDS = ("traceId", "spanId", "parentSpanId")
INT64 = (-(1 << 63), (1 << 63) - 1)


class TracesUnavailable(SessionRLError):
    """The OpenTelemetry packages this needs are not installed."""

    def __init__(self, missing: str) -> None:
        super().__init__(f"reading OTLP needs {missing}: pip install 'sessionrl[traces]'")


class BadPayload(SessionRLError):
    """A payload that cannot be read at all, or (strict reading) has refused spans: (where, rule) pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{where}: {rule}" for where, rule in problems))
        self.problems = problems


@dataclass
class Decoded:
    """The spans of a payload that passed the checks, and a (where, rule) problem per refused span."""

    spans: list[Span] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)


@cache
def _proto() -> tuple[Any, Any]:
    """(ExportTraceServiceRequest, json_format), imported on first use."""
    try:
        from google.protobuf import json_format  # type: ignore[import-untyped]
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    except ImportError as exc:
        raise TracesUnavailable(exc.name or "opentelemetry-proto") from exc
    return ExportTraceServiceRequest, json_format


def response_bytes(*, rejected: int, message: str, json: bool) -> bytes:
    """An `ExportTraceServiceResponse`, with a partial success when spans were rejected."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    reply = ExportTraceServiceResponse()
    if rejected:
        reply.partial_success.rejected_spans = rejected
        reply.partial_success.error_message = message
    if json:
        _, json_format = _proto()
        return orjson.dumps(json_format.MessageToDict(reply))
    return bytes(reply.SerializeToString())


def decode(body: bytes, *, json: bool, strict: bool = False) -> Decoded:
    """The spans of an OTLP request body; `BadPayload` when the body cannot be read (or, with `strict`,
    when any span is refused: then no span is returned)."""
    request_class, json_format = _proto()
    if json:
        request = _from_json(body, request_class, json_format)
    else:
        try:
            request = request_class.FromString(body)
        except Exception as exc:  # protobuf's DecodeError, and whatever a hostile body provokes
            raise BadPayload([("body", f"not an OTLP protobuf ExportTraceServiceRequest: {exc}")]) from exc
    decoded = Decoded()
    for where, resource, span in _spans(request):
        problem = _id_problem(span)
        if problem is not None:
            decoded.problems.append((f"{where}.{problem[0]}", problem[1]))
        else:
            decoded.spans.append(_span(span, resource, where))
    if strict and decoded.problems:
        raise BadPayload(decoded.problems)
    return decoded


def _from_json(body: bytes, request_class: Any, json_format: Any) -> Any:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadPayload([("body", f"malformed JSON: {exc}")]) from exc
    if not isinstance(doc, dict):
        raise BadPayload([("body", "expected a JSON object (an ExportTraceServiceRequest)")])
    problems: list[tuple[str, str]] = []
    _hex_ids_to_base64(doc, "", problems)
    if problems:
        raise BadPayload(problems)
    try:
        return json_format.ParseDict(doc, request_class(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise BadPayload([("body", f"not an OTLP/JSON ExportTraceServiceRequest: {exc}")]) from exc


def _hex_ids_to_base64(node: Any, where: str, problems: list[tuple[str, str]]) -> None:
    """OTLP/JSON spells ids in hex; protobuf's JSON reader expects base64. Converted in place."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            _hex_ids_to_base64(item, f"{where}[{i}]", problems)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        path = f"{where}.{key}" if where else key
        if key in ID_FIELDS and isinstance(value, str):
            try:
                node[key] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                problems.append((path, f"expected hex digits, got {value[:40]!r}"))
        elif isinstance(value, dict | list):
            _hex_ids_to_base64(value, path, problems)


def _spans(request: Any) -> Iterator[tuple[str, dict[str, Any], Any]]:
    for i, resource_spans in enumerate(request.resource_spans):
        resource = _attributes(resource_spans.resource.attributes)
        for j, scope_spans in enumerate(resource_spans.scope_spans):
            for k, span in enumerate(scope_spans.spans):
                yield f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]", resource, span


def _id_problem(span: Any) -> tuple[str, str] | None:
    """What is wrong with a span's ids, if anything: (field, rule)."""
    checks = (("traceId", span.trace_id, 16, True), ("spanId", span.span_id, 8, True))
    for name, value, size, required in (*checks, ("parentSpanId", span.parent_span_id, 8, False)):
        if not value and not required:
            continue
        if not value or not any(value):
            return name, "missing (empty or all zero): every span needs one"
        if len(value) != size:
            return name, f"expected {size} bytes, got {len(value)}"
    return None


def _span(span: Any, resource: dict[str, Any], where: str) -> Span:
    return Span(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex() or None,
        name=span.name,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes=_attributes(span.attributes),
        events=tuple(SpanEvent(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in span.events),
        status_code=int(span.status.code),
        status_message=span.status.message,
        resource=resource,
        where=where,
    )


def _attributes(pairs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return None if kind is None else getattr(value, kind)


# writing


def encode(spans: Iterable[Span], *, json: bool) -> bytes:
    """Spans as one `ExportTraceServiceRequest` (a resource per distinct resource, in first-seen order)."""
    request_class, json_format = _proto()
    request = request_class()
    scopes: dict[bytes, Any] = {}
    for span in spans:
        key = orjson.dumps(span.resource, option=orjson.OPT_SORT_KEYS)
        if key not in scopes:
            resource_spans = request.resource_spans.add()
            _set_attributes(resource_spans.resource.attributes, span.resource)
            scope = resource_spans.scope_spans.add()
            scope.scope.name = "sessionrl"
            scopes[key] = scope
        _fill(scopes[key].spans.add(), span)
    if not json:
        return bytes(request.SerializeToString())
    doc = json_format.MessageToDict(request, use_integers_for_enums=True)
    return orjson.dumps(_base64_ids_to_hex(doc))


def _fill(out: Any, span: Span) -> None:
    out.trace_id = bytes.fromhex(span.trace_id)
    out.span_id = bytes.fromhex(span.span_id)
    if span.parent_span_id:
        out.parent_span_id = bytes.fromhex(span.parent_span_id)
    out.name = span.name
    out.kind = 1  # SPAN_KIND_INTERNAL
    out.start_time_unix_nano = span.start_ns
    out.end_time_unix_nano = span.end_ns
    _set_attributes(out.attributes, span.attributes)
    for event in span.events:
        added = out.events.add()
        added.name, added.time_unix_nano = event.name, event.time_ns
        _set_attributes(added.attributes, event.attributes)
    out.status.code = span.status_code
    out.status.message = span.status_message


def _set_attributes(target: Any, attributes: dict[str, Any]) -> None:
    for key, value in attributes.items():
        if value is not None:
            kv = target.add()
            kv.key = key
            _set_value(kv.value, value)


def _set_value(target: Any, value: Any) -> None:
    if isinstance(value, str):
        target.string_value = value
    elif isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int) and INT64[0] <= value <= INT64[1]:
        target.int_value = value
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, bytes):
        target.bytes_value = value
    elif isinstance(value, list | tuple):
        target.array_value.SetInParent()
        for item in value:
            _set_value(target.array_value.values.add(), item)
    elif isinstance(value, dict):
        target.kvlist_value.SetInParent()
        _set_attributes(target.kvlist_value.values, value)
    else:
        target.string_value = str(value)


def _base64_ids_to_hex(node: Any) -> Any:
    if isinstance(node, list):
        return [_base64_ids_to_hex(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ID_FIELDS and isinstance(value, str):
            try:
                out[key] = base64.b64decode(value, validate=True).hex()
            except binascii.Error:
                out[key] = value
        else:
            out[key] = _base64_ids_to_hex(value)
    return out
