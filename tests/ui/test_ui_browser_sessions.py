"""The session list in a real headless Chromium, as a new user works in it: find a failed session, find the
Chinese seed session by an English word (its CJK text drawn with real glyphs, not boxes), and watch the
table follow the live counts. Screenshots are saved under each test's temporary folder."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect
from sessions_support import SEED_ID, fill
from ui_support import READER, TOKENS, log_in, serving

from sessionrl.service import parse_tokens
from sessionrl.session.model import SessionCreate
from sessionrl.store import SessionStore
from sessionrl.ui import UIConfig, create_ui_app

DRAWN = """([a, b]) => {
  const pixels = (text) => {
    const canvas = document.createElement("canvas");
    canvas.width = 64; canvas.height = 64;
    const ctx = canvas.getContext("2d");
    ctx.font = "48px " + getComputedStyle(document.body).fontFamily;
    ctx.fillText(text, 4, 52);
    return Array.from(ctx.getImageData(0, 0, 64, 64).data).join(",");
  };
  return [pixels(a) !== pixels(b), pixels(a) !== pixels("\\u{10FFFD}")];
}"""
"""Whether two CJK characters are drawn differently from each other and from a character no font has:
without a CJK font both come out as the same missing-glyph box."""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("browse")
    fill(root / "s.db", root / "runs")
    app = create_ui_app(f"sqlite:///{root / 's.db'}", UIConfig(runs_dir=root / "runs"), parse_tokens(TOKENS))
    for base in serving(app):
        yield base, root / "s.db"


def need_cjk_font() -> None:
    """Skip without a CJK font, except in CI, where its absence fails (`.ci/run` installs one)."""
    fc_list = shutil.which("fc-list")
    fonts = subprocess.run([fc_list, ":lang=zh"], capture_output=True, text=True).stdout if fc_list else ""
    if fonts.strip():
        return
    reason = "no CJK font (fc-list :lang=zh): apt-get install fonts-noto-cjk"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def test_find_a_failed_session_from_the_list(page: Any, site: tuple[str, Path], tmp_path: Path) -> None:
    base, _ = site
    log_in(page, base, READER)
    page.select_option("select[name=outcome]", "failed")
    page.click("form.filters button[type=submit]")
    expect(page.locator("#found")).to_have_text("1")
    row = page.locator("table.sessions tbody tr")
    expect(row.locator("td").nth(1)).to_have_text("finished · failed")
    expect(row.locator("td").nth(6)).to_contain_text("UNAVAILABLE")
    assert "outcome=failed" in page.url
    page.screenshot(path=tmp_path / "failed.png", full_page=True)
    row.locator("a").first.click()
    page.wait_for_url(f"{base}/ui/sessions/failed-1")
    expect(page.locator("h1 .badge.outcome-failed")).to_have_text("task failed")
    page.screenshot(path=tmp_path / "failed-session.png", full_page=True)


def test_find_the_chinese_seed_session_by_an_english_word(
    page: Any, site: tuple[str, Path], tmp_path: Path
) -> None:
    need_cjk_font()
    base, _ = site
    log_in(page, base, READER)
    page.fill("input[name=q]", "chronic disease")
    page.click("form.filters button[type=submit]")
    expect(page.locator("#found")).to_have_text("1")
    page.screenshot(path=tmp_path / "search.png", full_page=True)
    page.click(f"a[href='/ui/sessions/{SEED_ID}']")
    page.wait_for_url(f"{base}/ui/sessions/{SEED_ID}")
    expect(page.locator("table.feedback")).to_contain_text("慢性病")
    assert page.evaluate(DRAWN, ["\U0010fffb", "\U0010fffc"]) == [False, False]  # boxes are seen as such
    apart, not_boxes = page.evaluate(DRAWN, ["慢", "性"])
    page.screenshot(path=tmp_path / "seed.png", full_page=True)
    assert apart, "two CJK characters were drawn alike: boxes, not glyphs"
    assert not_boxes, "a CJK character was drawn as the missing-glyph box"


def test_the_table_follows_the_live_counts(page: Any, site: tuple[str, Path], tmp_path: Path) -> None:
    base, db = site
    log_in(page, base, READER, "/ui/sessions?state=created")
    expect(page.locator("#found")).to_have_text("0")
    expect(page.locator("[data-count=created]")).to_have_text("0")
    with SessionStore.open(f"sqlite:///{db}") as store:
        store.create(SessionCreate(user_query="opened elsewhere", session_id="live-1"))
    expect(page.locator("[data-count=created]")).to_have_text("1", timeout=15_000)
    expect(page.locator("#found")).to_have_text("1", timeout=15_000)  # no reload: the table followed
    expect(page.locator("a[href='/ui/sessions/live-1']")).to_be_visible()
    page.screenshot(path=tmp_path / "live.png", full_page=True)
