"""The retail data folder: parsed once, then copied per episode record by record, on first write.

`RetailData.load(folder)` reads the three JSON databases, the tasks, the tool schemas and the policy text.
The parsed databases are never changed. Each episode gets a `RetailDb`: a copy-on-write view that deep-copies
a record the first time a tool changes it, so opening an episode costs nothing and hashing the whole state
costs one digest per changed record.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson

from sessionrl.envs.base import Split

TABLES = ("users", "orders", "products")
DATA_ENV_VAR = "SESSIONRL_RETAIL_DATA"
_FILES = (*(f"{table}.json" for table in TABLES), "tools.json", "wiki.md", "tasks_train.json")

Record = dict[str, Any]


class RetailDataMissing(FileNotFoundError):
    """The retail data folder was not given or lacks files; the message says how to get it."""


def resolve_data_dir(data: str | Path | None, environ: Mapping[str, str] = os.environ) -> Path:
    """The retail data folder: `data` (a `--data DIR` option) if given, else `$SESSIONRL_RETAIL_DATA`.

    Raises `RetailDataMissing` naming what is missing and how to provide it.
    """
    raw = data if data is not None else environ.get(DATA_ENV_VAR)
    how = (
        f"Pass --data DIR or set {DATA_ENV_VAR}=DIR, where DIR holds the τ-bench retail domain as JSON "
        f"({', '.join(_FILES)}, tasks_dev.json, tasks_test.json): convert the data files of the public "
        "benchmark (sierra-research/tau-bench, MIT licence) or use a copy you already have."
    )
    if raw is None or str(raw) == "":
        raise RetailDataMissing(f"no retail data folder given. {how}")
    folder = Path(raw).expanduser()
    missing = [name for name in _FILES if not (folder / name).is_file()]
    if missing:
        raise RetailDataMissing(f"retail data folder {folder} lacks {', '.join(missing)}. {how}")
    return folder


def _digest(record: Any) -> bytes:
    """A canonical digest of one JSON value (keys sorted, so key order never matters)."""
    return hashlib.sha256(orjson.dumps(record, option=orjson.OPT_SORT_KEYS)).digest()


def _read_json(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


class RetailData:
    """The parsed contents of one retail data folder. Its databases stay read-only: `RetailDb` edits."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tables: dict[str, dict[str, Record]] = {t: _read_json(folder / f"{t}.json") for t in TABLES}
        self.tool_schemas: list[dict[str, Any]] = _read_json(folder / "tools.json")
        self.wiki = (folder / "wiki.md").read_text(encoding="utf-8")

    @classmethod
    def load(cls, data: str | Path | None = None) -> RetailData:
        """Load the folder `data`, or the one `resolve_data_dir` finds."""
        return cls(resolve_data_dir(data))

    def raw_tasks(self, split: Split) -> list[dict[str, Any]]:
        """The task records of one split (an empty list when the split's file is absent)."""
        path = self.folder / f"tasks_{split.value}.json"
        return list(_read_json(path)) if path.is_file() else []

    @cached_property
    def digests(self) -> dict[str, dict[str, bytes]]:
        """Per table, the digest of every original record, in sorted key order."""
        return {t: {key: _digest(self.tables[t][key]) for key in sorted(self.tables[t])} for t in TABLES}


class RetailDb:
    """One episode's copy of the databases: reads see the original until a record is first edited."""

    def __init__(self, data: RetailData) -> None:
        self._data = data
        self._edited: dict[str, dict[str, Record]] = {t: {} for t in TABLES}

    def get(self, table: str, key: str) -> Record | None:
        """The record, or None. Never mutate it: call `edit` to change a record."""
        edited = self._edited[table].get(key)
        return edited if edited is not None else self._data.tables[table].get(key)

    def edit(self, table: str, key: str) -> Record:
        """The episode's own, mutable copy of a record that exists (copied on first call)."""
        edited = self._edited[table]
        if key not in edited:
            edited[key] = orjson.loads(orjson.dumps(self._data.tables[table][key]))
        return edited[key]

    def items(self, table: str) -> Iterator[tuple[str, Record]]:
        """Every `(key, record)` of a table, as the episode sees it (read-only)."""
        edited = self._edited[table]
        for key, record in self._data.tables[table].items():
            yield key, edited.get(key, record)

    def state_hash(self) -> str:
        """A canonical hash of all three databases as this episode sees them.

        It hashes each record's digest in sorted key order, so it equals the hash of a full canonical dump
        in what it distinguishes, at the cost of re-digesting only the edited records.
        """
        hasher = hashlib.sha256()
        for table in TABLES:
            hasher.update(table.encode() + b"\0")
            edited = self._edited[table]
            for key, digest in self._data.digests[table].items():
                hasher.update(key.encode() + b"\0")
                hasher.update(_digest(edited[key]) if key in edited else digest)
        return hasher.hexdigest()
