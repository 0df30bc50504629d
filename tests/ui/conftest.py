"""Fixtures of the dashboard tests: a store holding orders-expert sessions (one scored) and generated ones,
a tiny run folder, the dashboard and the full service on 127.0.0.1, and Debian's Chromium driven by
Playwright. Every page a test opens fails the test if it logs a JavaScript error."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from ui_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    TOKENS,
    World,
    charged_to_steps,
    need_chromium,
    serving,
    tiny_run,
)

from sessionrl.envs import Split
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.episodes import expert, run_many
from sessionrl.rewards.engine import RewardConfig, RewardEngine
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.store import SessionStore, synthetic
from sessionrl.ui import UIConfig, create_ui_app


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("ui")
    db = root / "sessions.db"
    env = OrdersEnv(DomainConfig(train=4, dev=0, test=0, time_factor=0, transient_failures=False))
    with SessionStore.open(f"sqlite:///{db}") as store:
        # run_many runs its own event loop: in a thread, clear of the one Playwright's sync API holds here
        with ThreadPoolExecutor(1) as pool:
            pool.submit(run_many, env, Split.TRAIN, expert(env), 2, store=store, show_progress=False).result()
        expert_ids = store.session_ids()
        synthetic.ingest(store, 60, seed=3)
        engine = RewardEngine(RewardConfig(stats_path=root / "stats.json"))
        for session_id in expert_ids:  # the first teaches the efficiency term its best step count
            engine.score_and_store(store, session_id)
        scored = next(sid for sid in expert_ids if charged_to_steps(store.reward(sid).vector))
    tiny_run(root / "runs" / "tiny-grpo")
    return World(db, root / "runs", expert_ids, scored)


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


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one test module: Playwright's sync API holds an event loop in this thread while it
    runs, which would stop later tests from running their own (`asyncio.run`)."""
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
