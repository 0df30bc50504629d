"""Structured corrections and the penalty table that prices them.

A correction says what an answer left out and how much that matters: `{missing_element, severity}`. The
penalty table gives each known element a price per severity, the words that name it in comments (Chinese
and English), and the cue words the offline extractor looks for.

>>> table = load_penalty_table()
>>> table.penalty(Correction(missing_element="chronic_disease_exclusion", severity=Severity.HIGH))
-0.2
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sessionrl.errors import SessionRLError


class Severity(StrEnum):
    """How much an omission matters."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


class Correction(BaseModel):
    """One thing a comment says the answer left out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    missing_element: str = Field(min_length=1, max_length=120)
    severity: Severity

    @field_validator("missing_element")
    @classmethod
    def _snake_case(cls, value: str) -> str:
        return "_".join(value.strip().lower().replace("-", " ").split())


class Element(BaseModel):
    """A known element: its default severity, its prices and the words that name it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    severity: Severity = Severity.MEDIUM
    penalties: dict[Severity, float] | None = Field(
        default=None, description="Price per severity; the table's default prices when absent."
    )
    keywords: tuple[str, ...] = Field(min_length=1, description="Words naming the element, any language.")


class Cues(BaseModel):
    """Words that mark an omission, and words that raise or lower its severity."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    missing: tuple[str, ...] = Field(min_length=1)
    severity: dict[Severity, tuple[str, ...]] = Field(default_factory=dict)


class PenaltyTable(BaseModel):
    """Prices of corrections, keyed by element and severity."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_penalties: dict[Severity, float]
    elements: dict[str, Element]
    cues: Cues
    digest: str = Field(default="", description="Content hash of the file it was read from.")

    def penalty(self, correction: Correction) -> float:
        """The price of a correction; unknown elements cost the default price of their severity."""
        element = self.elements.get(correction.missing_element)
        prices = element.penalties if element is not None and element.penalties else self.default_penalties
        return prices.get(correction.severity, self.default_penalties.get(correction.severity, 0.0))


class PenaltyTableError(SessionRLError):
    """A penalty table file could not be read or is invalid."""


DEFAULT_TABLE = "penalties.yaml"


def default_table_path() -> Path:
    """The penalty table shipped with sessionrl."""
    return Path(str(resources.files("sessionrl.rewards").joinpath(DEFAULT_TABLE)))


def parse_penalty_table(text: bytes, source: str) -> PenaltyTable:
    """Validate the YAML text of a penalty table; errors name the field."""
    try:
        raw = yaml.safe_load(text)
        table = PenaltyTable.model_validate(raw)
    except yaml.YAMLError as exc:
        raise PenaltyTableError(f"{source}: not valid YAML: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PenaltyTableError(f"{source}: {where}: {first['msg']}") from exc
    return table.model_copy(update={"digest": hashlib.sha256(text).hexdigest()[:16]})


def load_penalty_table(path: Path | None = None) -> PenaltyTable:
    """Read a penalty table file (the shipped one when `path` is None)."""
    path = path or default_table_path()
    return parse_penalty_table(path.read_bytes(), str(path))
