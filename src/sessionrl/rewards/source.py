"""Hot reload: a rule file watched between scorings, with the last good rule-set kept on a bad edit.

`RuleSource.current()` costs two `stat` calls when nothing changed. When the rule file or its penalty
table changed size or modification time, the rule file is read and hashed; a new content hash is compiled.
A file that fails to load is rejected: the previous rule-set stays in force, `last_error` says what was
wrong (rule and problem), and the same broken content is not compiled again until it changes.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from sessionrl.rewards.rules import RuleFileError, RuleSet, compile_rules, default_rules_path
from sessionrl.rewards.terms import BUILTIN_TERMS, PythonTerm

log = logging.getLogger(__name__)

Fingerprint = tuple[tuple[int, int] | None, tuple[int, int] | None]


class RuleSource:
    """The rule-set of a rule file, reloaded when the file changes. Loading the first time must succeed.

    `terms` are the Python terms the file may switch on by name (the built-ins by default).
    """

    def __init__(self, path: Path | None = None, terms: Mapping[str, PythonTerm] = BUILTIN_TERMS) -> None:
        self.path = path or default_rules_path()
        self.terms = terms
        self.last_error: RuleFileError | None = None
        text = self._read()
        self._ruleset = compile_rules(text, str(self.path), self.path.parent, terms)
        self._hash = _content_hash(text, self._ruleset.penalties_path)
        self._fingerprint = self._stat()

    def current(self) -> RuleSet:
        """The rule-set in force: the file's if it (still) loads, else the last one that did."""
        fingerprint = self._stat()
        if fingerprint != self._fingerprint:
            self._fingerprint = fingerprint
            try:
                self._reload()
            except RuleFileError as exc:
                self.last_error = exc
                log.warning("rule file rejected, keeping %s: %s", self._ruleset.version, exc)
        return self._ruleset

    def reload(self) -> RuleSet:
        """Load the file now, whatever its fingerprint; raises `RuleFileError` (and keeps the old rules)."""
        self._fingerprint = self._stat()
        try:
            self._reload()
        except RuleFileError as exc:
            self.last_error = exc
            raise
        return self._ruleset

    def _reload(self) -> None:
        text = self._read()
        if _content_hash(text, self._ruleset.penalties_path) == self._hash:
            return
        ruleset = compile_rules(text, str(self.path), self.path.parent, self.terms)
        if ruleset.version != self._ruleset.version:
            log.info("rules reloaded: %s -> %s", self._ruleset.version, ruleset.version)
        self._ruleset, self._hash, self.last_error = (
            ruleset,
            _content_hash(text, ruleset.penalties_path),
            None,
        )
        self._fingerprint = self._stat()

    def _read(self) -> bytes:
        try:
            return self.path.read_bytes()
        except OSError as exc:
            raise RuleFileError(str(self.path), f"cannot read the file: {exc}") from exc

    def _stat(self) -> Fingerprint:
        """(mtime_ns, size) of the rule file and of the penalty table in force (None when missing)."""
        return (_stat(self.path), _stat(self._ruleset.penalties_path))


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _content_hash(text: bytes, penalties_path: Path) -> str:
    """Hash of the rule file's text and its penalty table's bytes (empty when the table is missing)."""
    try:
        penalties = penalties_path.read_bytes()
    except OSError:
        penalties = b""
    return hashlib.sha256(text + b"\0" + penalties).hexdigest()
