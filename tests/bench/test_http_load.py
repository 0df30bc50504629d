"""The constant-rate load of `bench/http_load.py`: requests are due on a schedule, and a late answer is
charged from the moment its request was due, not from when it went out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from http_load import Target, fixed_rate, percentile


@asynccontextmanager
async def server(delay_s: float, status: int = 200) -> AsyncIterator[int]:
    """A keep-alive HTTP/1.1 server on loopback that answers every request after `delay_s`, one at a time
    per connection; yields its port."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                await asyncio.sleep(delay_s)
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\n{{}}".encode())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with listener:
        yield listener.sockets[0].getsockname()[1]


def test_percentile_takes_the_nearest_rank_below() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0  # index int(0.5 * 99) = 49
    assert percentile(values, 0.99) == 99.0  # index int(0.99 * 99) = 98
    assert percentile([7.0], 0.99) == 7.0


async def test_the_schedule_fixes_how_many_requests_are_measured() -> None:
    # 2 connections at 100/s: request k of connection c is due at (2k + c) / 100 s after the start; the
    # window [0.195, 0.495) s holds the due times 20..49 hundredths: 30 requests, whatever the machine's
    # speed (the window's ends fall between due times)
    async with server(0.0) as port:
        run = await fixed_rate(
            [Target(port, ["/a", "/b"])], {}, rate=100, seconds=0.3, warmup_s=0.195, connections=2, token="t"
        )
    assert round(run["rps"] * 0.3) == 30
    assert run["failed"] == 0
    assert run["rate"] == 100


async def test_a_server_slower_than_the_rate_is_charged_its_queue() -> None:
    # one connection, due every 20 ms, a server taking 100 ms per answer; the window [0.19, 0.39) s holds
    # requests 10..19: the first goes out after 10 answers (1 s) at the earliest, 0.8 s late, the last,
    # due at 0.38 s, after 19 (1.9 s): at least 1.5 s late, where a closed loop would report 100 ms
    async with server(0.1) as port:
        run = await fixed_rate(
            [Target(port, ["/a"])], {}, rate=50, seconds=0.2, warmup_s=0.19, connections=1, token="t"
        )
    assert run["max_ms"] >= 1500
    assert run["late_share"] == 1.0
    assert run["p99_sent_ms"] >= 100  # timed from the send, each answer takes the server's 100 ms


async def test_failed_answers_are_counted() -> None:
    async with server(0.0, status=500) as port:
        run = await fixed_rate(
            [Target(port, ["/a"])], {}, rate=100, seconds=0.095, warmup_s=0.0, connections=1, token="t"
        )
    assert run["failed"] == round(run["rps"] * 0.095) == 10  # due at 0, 10, ..., 90 ms
