"""The fake upstream of `bench/gateway.py` speaks OpenAI's streamed chat: a first chunk stamped with its
send time, UPSTREAM_CHUNKS of content, the finish, the usage only when asked, then `[DONE]`."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fastapi.testclient import TestClient

from gateway import UPSTREAM_CHUNKS, disk_sync_ms, fake_upstream


def events(client: TestClient, body: dict[str, object]) -> list[str]:
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        return [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]


def test_the_fake_upstream_streams_a_stamped_first_chunk_and_the_usage_when_asked() -> None:
    client = TestClient(fake_upstream())
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "q"}]}
    before = time.monotonic()
    plain = events(client, body)
    asked = events(client, body | {"stream_options": {"include_usage": True}})
    assert len(plain) == 1 + UPSTREAM_CHUNKS + 1 + 1  # first, content, finish, [DONE]
    assert len(asked) == len(plain) + 1
    assert plain[-1] == asked[-1] == "[DONE]"
    first = json.loads(plain[0])
    assert before <= first["sent_at"] <= time.monotonic()
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in plain[:-1])
    assert text == "ok " * UPSTREAM_CHUNKS
    assert json.loads(asked[-2])["usage"]["completion_tokens"] == UPSTREAM_CHUNKS


def test_the_disk_sync_probe_times_syncs_and_leaves_nothing_behind(tmp_path: Path) -> None:
    assert disk_sync_ms(tmp_path, syncs=3) >= 0.0
    assert list(tmp_path.iterdir()) == []
