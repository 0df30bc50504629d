"""Without PostgreSQL the PostgreSQL tests skip on a developer's machine and fail in CI."""

from __future__ import annotations

import pytest

import pg_support


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_postgresql_fails_in_ci_and_skips_elsewhere(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(pg_support, "find_bin_dir", lambda: None)
    with pytest.raises(outcome, match="PostgreSQL is not installed"), pg_support.local_postgres("x"):
        pass
