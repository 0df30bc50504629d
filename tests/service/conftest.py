"""Fixtures for the service tests: an app over an in-memory store and a writer's client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from service_support import make_app, serving


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with serving(make_app()) as connected:
        yield connected
