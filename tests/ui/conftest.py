"""Fixtures of the browser tests: a store holding orders-expert sessions (one scored) and generated ones, a
tiny run folder, the dashboard and the full service on 127.0.0.1, and Debian's Chromium driven by
Playwright. Every page a test opens fails the test if it logs a JavaScript error."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvicorn

from sessionrl.envs import Split
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.episodes import expert, run_many
from sessionrl.rewards.engine import RewardConfig, RewardEngine
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.store import SessionStore, synthetic
from sessionrl.ui import UIConfig, create_ui_app

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


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("ui")
    db = root / "sessions.db"
    env = OrdersEnv(DomainConfig(train=4, dev=0, test=0, time_factor=0, transient_failures=False))
    with SessionStore.open(f"sqlite:///{db}") as store:
        # run_many runs its own event loop: in a thread, clear of any loop the test runner holds
        with ThreadPoolExecutor(1) as pool:
            pool.submit(run_many, env, Split.TRAIN, expert(env), 2, store=store, show_progress=False).result()
        expert_ids = store.session_ids()
        synthetic.ingest(store, 60, seed=3)
        engine = RewardEngine(RewardConfig(stats_path=root / "stats.json"))
        for session_id in expert_ids:  # the first teaches the efficiency term its best step count
            engine.score_and_store(store, session_id)
        scored = next(sid for sid in expert_ids if _charged_to_steps(store.reward(sid).vector))
    tiny_run(root / "runs" / "tiny-grpo")
    return World(db, root / "runs", expert_ids, scored)


def _charged_to_steps(vector: dict[str, Any]) -> bool:
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


@pytest.fixture(scope="session")
def dashboard(world: World) -> Iterator[str]:
    """`sessionrl ui` over the world: the dashboard alone."""
    app = create_ui_app(f"sqlite:///{world.db}", UIConfig(runs_dir=world.runs), parse_tokens(TOKENS))
    yield from serving(app)


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`sessionrl serve` over an empty store: the API that writes, with the dashboard mounted."""
    db = tmp_path_factory.mktemp("service") / "service.db"
    yield from serving(create_app(ServiceConfig(db_url=f"sqlite:///{db}", tokens=parse_tokens(TOKENS))))


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    opened = browser.new_context(viewport={"width": 1280, "height": 900})
    yield opened
    opened.close()


@pytest.fixture
def page(context: Any) -> Iterator[Any]:
    """A page that records every console error and uncaught exception; the test fails if there were any."""
    errors: list[str] = []
    opened = context.new_page()
    opened.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    opened.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    yield opened
    assert errors == [], errors


def log_in(page: Any, base: str, token: str, path: str = "/ui/sessions") -> None:
    """Open `path`, get sent to the login page, log in with `token`, land back on `path`."""
    page.goto(base + path)
    assert "/ui/login" in page.url
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(base + path)
