"""Fixtures of the training tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tiny_orders import OrdersWorld, build_orders_world


@pytest.fixture(scope="session")
def orders_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OrdersWorld]:
    """A small orders world shared by the whole session (building the tokenizer takes a moment)."""
    yield from build_orders_world(tmp_path_factory)
