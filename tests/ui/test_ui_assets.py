"""Every script and style the pages name is vendored in the package, beside its licence, so the dashboard
and `/docs` work offline."""

from __future__ import annotations

import re
from pathlib import Path

import sessionrl.ui

PACKAGE = Path(sessionrl.ui.__file__).parent
STATIC = PACKAGE / "static"


def test_every_asset_a_page_names_is_in_the_package() -> None:
    sources = [*(PACKAGE / "templates").glob("*.html"), PACKAGE / "app.py"]
    # `{{ static }}/x` in the templates, `{STATIC}/x` in the code
    pattern = r"(?:\{\{ static \}\}|\{STATIC\})/([\w./-]+)"
    named = {path for source in sources for path in re.findall(pattern, source.read_text())}
    assert {"htmx/htmx.min.js", "uplot/uPlot.iife.min.js", "swagger-ui/swagger-ui-bundle.js"} <= named
    assert sorted(p for p in named if not (STATIC / p).is_file()) == []


def test_each_vendored_library_keeps_its_licence() -> None:
    libraries = [d for d in STATIC.iterdir() if d.is_dir()]
    assert sorted(d.name for d in libraries) == ["htmx", "swagger-ui", "uplot"]
    assert all((d / "LICENSE").is_file() for d in libraries)
    assert all(d.name in (STATIC / "VENDORED.md").read_text() for d in libraries)
