"""A τ-bench data folder: JSON tables parsed once, then copied per episode record by record, on first write.

A folder holds one `<table>.json` per table (a JSON object mapping each key to its record), `tools.json`
(OpenAI function schemas), `wiki.md` (the domain policy) and `tasks_<split>.json` for each split it has.
`TauData.load` reads it once and never changes it. Each episode gets a `TauDb`: a copy-on-write view that
deep-copies a record the first time a tool changes it and keeps the records a tool inserts, so opening an
episode costs nothing and hashing the whole state costs one digest per changed or new record.
"""

from __future__ import annotations

import hashlib
import heapq
import os
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson

from sessionrl.envs.base import Split
from sessionrl.envs.registry import EnvBuildError

Record = dict[str, Any]
"""One row of a table: a JSON object."""

DOMAIN_FILES = ("tools.json", "wiki.md")
"""Files every folder holds besides its tables and task files."""


class DataMissing(EnvBuildError, FileNotFoundError):
    """A domain's data folder was not given, lacks files or holds a malformed table; the message says how
    to provide it. `variable` names the environment variable that may give the folder, if any; `problem`
    is the message's first part, what is wrong without the advice."""

    def __init__(self, message: str, *, variable: str | None = None, problem: str = "") -> None:
        super().__init__(message)
        self.variable = variable
        self.problem = problem or message


def resolve_data_dir(
    domain: str,
    tables: Sequence[str],
    data: str | Path | None,
    *,
    variable: str | None = None,
    source: str = "",
    environ: Mapping[str, str] = os.environ,
) -> Path:
    """The data folder of `domain`: `data` if given, else `$variable`; it must hold every table file,
    `tools.json`, `wiki.md` and at least one `tasks_<split>.json`.

    Raises `DataMissing` naming exactly what is missing (no folder, or the files it lacks) and how to
    provide it (`source` says where to get the data).
    """
    raw = data if data is not None else (environ.get(variable) if variable else None)
    files = [*(f"{table}.json" for table in tables), *DOMAIN_FILES]
    tasks = _task_files()
    where = f"--data DIR or set {variable}=DIR" if variable else "--data DIR"
    got = f": {source}" if source else "."
    if raw is None or str(raw) == "":
        problem = f"no {domain} data folder given"
        needs = f"{', '.join(files)} and {tasks}"
        message = f"{problem}. Pass {where}, where DIR holds {needs}{got}"
        raise DataMissing(message, variable=variable, problem=problem)
    folder = Path(raw).expanduser()
    if not folder.is_dir():
        problem = f"{domain} data folder {folder} does not exist"
        raise DataMissing(f"{problem}. Pass {where}{got}", variable=variable, problem=problem)
    missing = [name for name in files if not (folder / name).is_file()]
    if not any((folder / f"tasks_{split.value}.json").is_file() for split in Split):
        missing.append(tasks)
    if missing:
        problem = f"{domain} data folder {folder} lacks {_listing(missing)}"
        raise DataMissing(f"{problem}{got}", variable=variable, problem=problem)
    return folder


def _task_files() -> str:
    """The task files a folder may hold, one of which it must.

    >>> _task_files()
    'a task file (tasks_train.json, tasks_dev.json or tasks_test.json; one is enough)'
    """
    names = [f"tasks_{split.value}.json" for split in Split]
    return f"a task file ({', '.join(names[:-1])} or {names[-1]}; one is enough)"


def _listing(names: Sequence[str]) -> str:
    """`a`, `a and b`, `a, b and c`.

    >>> _listing(["wiki.md"]), _listing(["a", "b", "c"])
    ('wiki.md', 'a, b and c')
    """
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _digest(value: Any) -> bytes:
    """A canonical digest of one JSON value (keys sorted, so key order never matters)."""
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).digest()


def _read_json(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def _read_table(folder: Path, table: str) -> dict[str, Record]:
    rows = _read_json(folder / f"{table}.json")
    if not isinstance(rows, dict):
        raise DataMissing(f"{folder / f'{table}.json'} must be a JSON object mapping each key to its record")
    return rows


class TauData:
    """The parsed contents of one data folder. Its tables stay read-only: `TauDb` edits and inserts."""

    def __init__(self, folder: Path, tables: Sequence[str]) -> None:
        self.folder = folder
        self.tables: dict[str, dict[str, Record]] = {table: _read_table(folder, table) for table in tables}
        self.tool_schemas: list[dict[str, Any]] = _read_json(folder / "tools.json")
        self.policy = (folder / "wiki.md").read_text(encoding="utf-8")

    def raw_tasks(self, split: Split) -> list[dict[str, Any]]:
        """The task records of one split (an empty list when the split's file is absent)."""
        path = self.folder / f"tasks_{split.value}.json"
        return list(_read_json(path)) if path.is_file() else []

    @cached_property
    def digests(self) -> dict[str, dict[str, bytes]]:
        """Per table, the digest of every original record, in sorted key order."""
        return {
            table: {key: _digest(rows[key]) for key in sorted(rows)} for table, rows in self.tables.items()
        }


class TauDb:
    """One episode's copy of the tables: reads see the original until a record is first edited; records a
    tool inserts live here only."""

    def __init__(self, data: TauData) -> None:
        self._data = data
        self._edited: dict[str, dict[str, Record]] = {table: {} for table in data.tables}
        self._inserted: dict[str, dict[str, Record]] = {table: {} for table in data.tables}

    def get(self, table: str, key: str) -> Record | None:
        """The record, or None. Never mutate it: call `edit` to change a record."""
        for layer in (self._edited[table], self._inserted[table], self._data.tables[table]):
            if key in layer:
                return layer[key]
        return None

    def edit(self, table: str, key: str) -> Record:
        """The episode's own, mutable copy of a record that exists (copied on first call)."""
        inserted = self._inserted[table].get(key)
        if inserted is not None:
            return inserted
        edited = self._edited[table]
        if key not in edited:
            edited[key] = orjson.loads(orjson.dumps(self._data.tables[table][key]))
        return edited[key]

    def insert(self, table: str, key: str, record: Record) -> Record:
        """Add a new record under `key` (a copy of `record`) and return it; the key must be new.

        Raises `KeyError` when `key` is already taken: a tool checks first and reports a domain error.
        """
        if self.get(table, key) is not None:
            raise KeyError(f"{table} already holds {key!r}")
        self._inserted[table][key] = orjson.loads(orjson.dumps(record))
        return self._inserted[table][key]

    def items(self, table: str) -> Iterator[tuple[str, Record]]:
        """Every `(key, record)` of a table as the episode sees it (read-only): originals, then inserts."""
        edited = self._edited[table]
        for key, record in self._data.tables[table].items():
            yield key, edited.get(key, record)
        yield from self._inserted[table].items()

    def state_hash(self) -> str:
        """A canonical hash of every table as this episode sees it.

        It hashes each record's digest in sorted key order (original and inserted keys merged), so it
        distinguishes what a full canonical dump would, at the cost of digesting only changed and new
        records. A record inserted under some key hashes as if it had been in the data all along.
        """
        hasher = hashlib.sha256()
        for table, digests in self._data.digests.items():
            hasher.update(table.encode() + b"\0")
            edited, inserted = self._edited[table], self._inserted[table]
            for key in heapq.merge(digests, sorted(inserted)):
                hasher.update(key.encode() + b"\0")
                record = edited.get(key, inserted.get(key))
                hasher.update(_digest(record) if record is not None else digests[key])
        return hasher.hexdigest()
