"""Canonical encoding of sessions: the same session always gives the same bytes and digest."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from pydantic import BaseModel

_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC


def dumps(model: BaseModel | dict[str, Any]) -> bytes:
    """Canonical JSON bytes (sorted keys, UTC timestamps) of a model or a plain document."""
    doc = model.model_dump(mode="json") if isinstance(model, BaseModel) else model
    return orjson.dumps(doc, option=_OPTS)


def digest(model: BaseModel | dict[str, Any]) -> str:
    """SHA-256 hex digest of the canonical encoding; equal sessions have equal digests."""
    return hashlib.sha256(dumps(model)).hexdigest()
