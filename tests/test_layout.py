"""The test tree's own rule: pytest imports test files by basename (there are no packages under tests/), so
two files with one name make a collection error on a clean checkout that a warm cache can hide."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_test_file_basename_is_unique() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
