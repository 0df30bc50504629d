"""Helpers of the dashboard tests: tokens, Chromium, a tiny run folder, a server on a loopback port."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvicorn

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
READER, WRITER = "reader-token-0123", "writer-token-4567"
TOKENS = f"{READER}:read;{WRITER}:read,write"


def need_chromium() -> None:
    """Skip without Debian's Chromium, except in CI, where its absence fails (`.ci/run` installs it)."""
    if CHROMIUM.exists():
        return
    reason = f"{CHROMIUM} not found: the browser tests need Debian's chromium (apt-get install chromium)"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@dataclass(frozen=True)
class World:
    """What the tests browse: the store's file, the expert sessions (the first is scored) and the run."""

    db: Path
    runs: Path
    expert_ids: list[str]
    scored: str


def tiny_run(folder: Path) -> None:
    """A run folder as `sessionrl train` leaves it: config, imitation and RL curves, two evaluations."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(
        "trainer: grpo\nseed: 0\nevaluation:\n  split: test\n  tasks: 4\n  thresholds:\n    tcsr: 0.85\n"
    )
    lines = [{"stage": "sft", "step": i, "time": 1.7e9 + i, "loss": 2.0 / (i + 1)} for i in range(6)]
    lines += [
        {
            "stage": "rl",
            "step": i,
            "time": 1.7e9 + 10 + i,
            "reward": 0.1 * i,
            "success": 0.15 * i,
            "kl": 0.01 * i,
        }
        for i in range(5)
    ]
    for k, (label, success) in enumerate((("sft", 0.5), ("rl", 0.75))):
        lines.append(
            {"stage": "eval", "step": k, "time": 1.7e9 + 20 + k, "label": label, "success": success,
             "tcsr": 0.9, "dvr": 1.0, "er5": 0.6, "spt": 4.0, "pass^1": success,
             "failures": {"wrong_order": 1 + k, "no_answer": 1}}
        )  # fmt: skip
    (folder / "metrics.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))


def charged_to_steps(vector: dict[str, Any]) -> bool:
    """Whether a stored reward vector charges some term to steps."""
    return any(term["steps"] for term in vector["terms"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving(app: Any) -> Iterator[str]:
    """Run `app` on a free loopback port in a thread; yield its base URL, then stop it."""
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=free_port(), log_level="warning", timeout_graceful_shutdown=1
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "the server stopped while starting"
        assert time.monotonic() < deadline, "the server did not start in 30 s"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


def log_in(page: Any, base: str, token: str, path: str = "/ui/sessions") -> None:
    """Open `path`, get sent to the login page, log in with `token`, land back on `path`."""
    page.goto(base + path)
    assert "/ui/login" in page.url
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(base + path)
