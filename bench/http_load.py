"""Raw HTTP/1.1 load on asyncio for the benches: keep-alive connections with one request in flight each,
and a constant-rate load that measures latency from each request's intended send time.

A closed loop (each connection sends its next request when the last is answered) slows down with the
server, so its latencies leave out the time requests would have waited: its p99 describes the queue it
built, not what a client sending at a steady rate sees. `fixed_rate` sends on a schedule instead (as
wrk2 does): request k of connection c is due at `start + (k * connections + c) / rate`, and its latency
runs from that moment, so a request sent late because the server (or the client) fell behind is charged
the delay.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass
from typing import Any

HOST = "127.0.0.1"


class Conn:
    """One keep-alive HTTP/1.1 connection to `HOST` with one request in flight, sending a bearer token."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str) -> None:
        self.reader = reader
        self.writer = writer
        self.token = token

    @classmethod
    async def open(cls, port: int, token: str) -> Conn:
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer, token)

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else b""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {self.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        self.writer.write(head.encode() + data)
        header = await self.reader.readuntil(b"\r\n\r\n")
        status = int(header[9:12])
        length = 0
        for line in header.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def call(conn: Conn, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """A request whose answer must be a success; its JSON body."""
    status, payload = await conn.request(method, path, body)
    if status >= 300:
        raise RuntimeError(f"{method} {path} -> {status}: {payload[:300]!r}")
    result: dict[str, Any] = json.loads(payload)
    return result


@dataclass(frozen=True, slots=True)
class Target:
    """A server to load: its port and the paths its connections walk, `repeat` requests on each."""

    port: int
    paths: list[str]
    repeat: int = 1


def percentile(sorted_values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of an ascending list, the nearest rank below.

    >>> percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5), percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.99)
    (3.0, 4.0)
    """
    return sorted_values[int(q * (len(sorted_values) - 1))]


async def fixed_rate(
    targets: list[Target],
    body: dict[str, Any],
    *,
    rate: float,
    seconds: float,
    warmup_s: float,
    connections: int,
    token: str,
) -> dict[str, float]:
    """POST `body` at `rate` requests/s in all over `connections` connections spread evenly over
    `targets`, for `warmup_s` then `seconds` measured; latencies (from the intended send time) of the
    requests due inside the measured window. A request that fails (not 2xx) is counted, never dropped.
    Returns `rate` (asked), `rps` (requests due in the window, every one answered, per second),
    `p50_ms`, `p99_ms`, `max_ms`, `late_share` (requests sent 1 ms or more after they were due: the
    client or the server fell behind), `p99_sent_ms` (the p99 timed from the actual send instead, what a
    closed loop would report) and `failed`.
    """
    start = time.perf_counter() + 0.05
    t0, t1 = start + warmup_s, start + warmup_s + seconds
    latencies: list[float] = []
    from_send: list[float] = []
    late = failed = 0

    async def connection(c: int) -> None:
        nonlocal late, failed
        target = targets[c % len(targets)]
        mine = target.paths[c // len(targets) :: max(1, connections // len(targets))] or target.paths
        conn = await Conn.open(target.port, token)
        k = 0
        while (due := start + (k * connections + c) / rate) < t1:
            if (wait := due - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            sent = time.perf_counter()
            status, _ = await conn.request("POST", mine[(k // target.repeat) % len(mine)], body)
            if due >= t0:
                latencies.append((answered := time.perf_counter()) - due)
                from_send.append(answered - sent)
                late += sent - due >= 0.001
                failed += not 200 <= status < 300
            k += 1
        conn.close()

    await asyncio.gather(*(connection(c) for c in range(connections)))
    latencies.sort()
    return {
        "rate": rate,
        "rps": len(latencies) / seconds,
        "p50_ms": 1000 * percentile(latencies, 0.5),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "max_ms": 1000 * latencies[-1],
        "late_share": late / len(latencies),
        "p99_sent_ms": 1000 * percentile(sorted(from_send), 0.99),
        "failed": float(failed),
    }
