"""End to end: an unchanged agent written with the official `openai` package, traced by the standard
instrumentations (`opentelemetry-instrumentation-openai-v2`, then `openinference-instrumentation-openai`),
talks to a local fake model server and exports its spans with the standard OTLP HTTP exporter, configured
only through `OTEL_EXPORTER_OTLP_*`, to a `sessionrl serve` process. Its sessions are stored with every
LLM call, every tool call and their results, and `sft.data: store` trains on them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest

from serve_support import serve_process
from sessionrl.session.model import CallStatus, Session, SessionState
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.loop import train_sft
from tiny_run_support import tiny_run

pytestmark = pytest.mark.slow

AGENT = Path(__file__).resolve().parents[1] / "otlp_agent.py"
TOKEN = "trace-writer"
QUESTIONS = ["Where is order 7?", "Where is order 12?", "Where is order -3?"]


def reply(body: dict[str, Any]) -> dict[str, Any]:
    """The fake model: ask for the order's status, then answer from the tool's result."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        found = json.loads(last["content"])
        text = (
            f"Order {found['order_id']} is {found['status']}."
            if "status" in found
            else "I could not find it."
        )
        message: dict[str, Any] = {"role": "assistant", "content": text}
    else:
        order = int(re.findall(r"-?\d+", last["content"])[0])
        call = {
            "id": f"call_{abs(order)}",
            "type": "function",
            "function": {"name": "order_status", "arguments": json.dumps({"order_id": order})},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    }


class FakeModel(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = orjson.dumps(reply(orjson.loads(self.rfile.read(int(self.headers["Content-Length"])))))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def model_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeModel)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def run_agent(kind: str, model_url: str, service_url: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env |= {
        "OTEL_EXPORTER_OTLP_ENDPOINT": service_url,
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{TOKEN}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        # the instrumentations' own switches: the latest GenAI conventions, message content on the spans
        "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "span_only",
    }
    done = subprocess.run(
        [sys.executable, str(AGENT), kind, model_url, *QUESTIONS],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Failed to export" not in done.stderr, done.stderr
    return done.stdout.splitlines()


def finished_sessions(db: Path, count: int) -> list[Session]:
    """The store's finished sessions once `count` are there (the receiver finishes them shortly after
    their root spans come)."""
    deadline = time.monotonic() + 30
    with SessionStore.open(f"sqlite:///{db}") as store:
        while True:
            rows = store.query(SessionQuery(state=SessionState.FINISHED, limit=100))
            if len(rows) >= count or time.monotonic() > deadline:
                return sorted((store.get(r.session_id) for r in rows), key=lambda s: s.created_at)


@pytest.mark.parametrize("kind", ["genai", "openinference"])
def test_an_instrumented_agent_is_captured_through_otlp(
    kind: str, model_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SESSIONRL_TRACES_ROOT_GRACE_S", "0.2")
    (tmp_path / "skills").mkdir()
    db = tmp_path / "sessions.db"
    with serve_process(db, tmp_path / "skills", TOKEN) as (url, _):
        answers = run_agent(kind, model_url, url)
        sessions = finished_sessions(db, len(QUESTIONS))
    assert answers == ["Order 7 is packed.", "Order 12 is shipped.", "I could not find it."]
    assert [s.user_query for s in sessions] == QUESTIONS
    for session, said in zip(sessions, answers, strict=True):
        first, second = session.llm_calls
        assert [(m.role, m.content) for m in first.messages] == [("user", session.user_query)]
        assert [t.name for t in first.tool_calls] == ["order_status"]
        assert [m.role for m in second.messages] == ["user", "assistant", "tool"]
        assert second.response == said
        assert first.usage == {
            "prompt_tokens": 12,
            "completion_tokens": 7,
            **({} if kind == "genai" else {"total_tokens": 19}),
        }
        (tool,) = session.tool_calls
        assert tool.call_id == first.tool_calls[0].id
        assert tool.params == orjson.loads(first.tool_calls[0].arguments)
        assert session.final_output is not None
        assert session.final_output.text == said
    packed, shipped, missing = (s.tool_calls[0] for s in sessions)
    assert (packed.status, packed.output) == (CallStatus.SUCCESS, {"order_id": 7, "status": "packed"})
    assert shipped.output == {"order_id": 12, "status": "shipped"}
    assert (missing.status, missing.error_message) == (CallStatus.ERROR, "no order -3")
    trains_on(f"sqlite:///{db}", tmp_path / "run", len(QUESTIONS))


def trains_on(url: str, run_dir: Path, sessions: int) -> None:
    """`sft.data: store` keeps every captured session and takes a step on them."""
    sft = {
        "data": "store",
        "store": {"db": url, "filters": {}},
        "trainer": {"steps": 1, "batch_sessions": 2, "token_budget": 2048},
    }
    train_sft(RunConfig.model_validate({**tiny_run(trainer="sft"), "run_dir": str(run_dir), "sft": sft}))
    records = [orjson.loads(line) for line in (run_dir / "metrics.jsonl").read_bytes().splitlines()]
    (captured,) = [r for r in records if r["stage"] == "captured"]
    assert (captured["kept"], captured["dropped"]) == (sessions, 0)
    assert (run_dir / "sft_policy" / "config.json").is_file()
