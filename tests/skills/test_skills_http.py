"""HTTP skills against a real server on 127.0.0.1 (an ephemeral port, in a thread of this process)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import pytest
from skills_support import EXAMPLES

from sessionrl.skills import ErrorCode, ExecutorConfig, ManualClock, SkillExecutor, http_skill, load_contract

CRP = load_contract(EXAMPLES / "crp_test_request.yaml")


class LabHandler(BaseHTTPRequestHandler):
    """A tiny lab-order service; each path shows one way an HTTP backend answers."""

    hits: ClassVar[dict[str, int]] = {}

    def do_POST(self) -> None:
        LabHandler.hits[self.path] = LabHandler.hits.get(self.path, 0) + 1
        params = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/crp":
            if self.headers.get("Authorization") != "Bearer lab-token":
                return self._send(401, {"detail": "missing token"})
            if params["patient_id"] == "p-missing":
                return self._send(404, {"error_code": "PATIENT_NOT_FOUND", "message": "no such patient"})
            order = {
                "order_id": f"o-{params['patient_id']}",
                "status": "queued",
                "expected_ready_minutes": 45,
            }
            return self._send(200, order)
        if self.path == "/busy":
            return self._send(503, None, b"overloaded")
        if self.path == "/throttled":
            return self._send(429, None, b"slow down")
        if self.path == "/slow":
            time.sleep(1.0)
        return self._send(200, None, b"<html>not json</html>")

    def _send(self, status: int, body: Any, raw: bytes = b"") -> None:
        data = json.dumps(body).encode() if body is not None else raw
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def lab_url() -> Iterator[str]:
    LabHandler.hits = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), LabHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _executor(url: str, path: str, **config: Any) -> SkillExecutor:
    skill = http_skill(CRP, url + path, headers={"Authorization": "Bearer lab-token"})
    return SkillExecutor([skill], ExecutorConfig(**config), clock=ManualClock())


async def test_a_success_payload_comes_back(lab_url: str):
    async with _executor(lab_url, "/crp") as executor:
        result = await executor.call("crp_test_request", {"patient_id": "p-1"})
    assert result.ok
    assert result.output == {"order_id": "o-p-1", "status": "queued", "expected_ready_minutes": 45}


async def test_a_contract_code_in_the_body_is_kept(lab_url: str):
    async with _executor(lab_url, "/crp") as executor:
        result = await executor.call("crp_test_request", {"patient_id": "p-missing"})
    assert (result.error_code, result.error_message, result.retryable) == (
        "PATIENT_NOT_FOUND",
        "no such patient",
        False,
    )


async def test_a_missing_token_is_an_internal_error(lab_url: str):
    skill = http_skill(CRP, lab_url + "/crp")
    async with SkillExecutor([skill]) as executor:
        result = await executor.call("crp_test_request", {"patient_id": "p-1"})
    assert result.error_code == ErrorCode.INTERNAL
    assert result.error_message == 'HTTP 401: {"detail": "missing token"}'


@pytest.mark.parametrize(
    ("path", "code", "attempts"),
    [
        ("/busy", ErrorCode.UNAVAILABLE, 3),
        ("/throttled", ErrorCode.RATE_LIMITED, 3),
        ("/html", "INVALID_OUTPUT", 1),
    ],
)
async def test_status_codes_map_to_error_codes_and_retries(lab_url: str, path: str, code: str, attempts: int):
    async with _executor(lab_url, path) as executor:
        result = await executor.call("crp_test_request", {"patient_id": "p-1"})
    assert (result.error_code, result.attempts, LabHandler.hits[path]) == (code, attempts, attempts)


async def test_a_slow_endpoint_times_out(lab_url: str):
    fast = CRP.model_copy(update={"sla": CRP.sla.model_copy(update={"timeout_s": 0.1})})
    async with SkillExecutor(
        [http_skill(fast, lab_url + "/slow")], ExecutorConfig(max_attempts=1)
    ) as executor:
        result = await executor.call("crp_test_request", {"patient_id": "p-1"})
    assert result.error_code == ErrorCode.TIMEOUT


async def test_a_closed_port_is_unavailable():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with _executor(f"http://127.0.0.1:{port}", "/crp", max_attempts=1) as executor:
        result = await executor.call("crp_test_request", {"patient_id": "p-1"})
    assert (result.error_code, result.retryable) == (ErrorCode.UNAVAILABLE, True)


async def test_a_shared_client_is_left_open_for_its_owner(lab_url: str):
    async with httpx.AsyncClient() as client:
        skill = http_skill(
            CRP, lab_url + "/crp", headers={"Authorization": "Bearer lab-token"}, client=client
        )
        async with SkillExecutor([skill]) as executor:
            assert (await executor.call("crp_test_request", {"patient_id": "p-2"})).ok
        assert not client.is_closed
