"""Fixtures shared across the suite."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def retail_data() -> Path:
    """The public τ-bench retail data folder laid beside the repository."""
    path = REPO.parent / "shared" / "taubench" / "retail"
    if not (path / "users.json").exists():
        pytest.skip(f"τ-bench retail data not found at {path}")
    return path
