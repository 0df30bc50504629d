"""JSON Schema helpers for skill parameters and outputs: defaults, clipping, readable errors, sample
instances, and the check that a value is JSON at all.

All helpers return new values and never change their inputs.

>>> schema = {"type": "object", "properties": {"amount": {"type": "number", "maximum": 120},
...           "unit": {"type": "string", "default": "mg/L"}}}
>>> fill_defaults(schema, {"amount": 500})
{'amount': 500, 'unit': 'mg/L'}
>>> clip_numbers(schema, {"amount": 500})
({'amount': 120}, ('amount: 500 clipped to the maximum of 120',))
>>> validation_errors(validator_for(schema), {"amount": 500})
('amount: 500 is greater than the maximum of 120',)
>>> json_problem({"items": [1, {2, 3}]})
'items[1]: a set is not a JSON value (use a list, a mapping, a string, a number, a bool or None)'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from sessionrl.skills.quickcheck import quick_check

Json = dict[str, Any]
_MAX_MESSAGE = 200


class SchemaValidator:
    """JSON Schema 2020-12, `format` included, built once per schema and checked on every call.

    A plain schema's yes comes from a predicate compiled for it (`quick_check`); anything else, every
    no included, is jsonschema's to decide and to word.
    """

    def __init__(self, schema: Json) -> None:
        self.full = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        self._quick = quick_check(schema)

    def is_valid(self, value: Any) -> bool:
        """Whether `value` satisfies the schema."""
        return (self._quick is not None and self._quick(value)) or self.full.is_valid(value)


def validator_for(schema: Json) -> SchemaValidator:
    """A validator for `schema` (JSON Schema 2020-12) that also checks the `format` keyword."""
    return SchemaValidator(schema)


def schema_problems(schema: object) -> str | None:
    """Why `schema` is not a usable JSON Schema (written as a mapping), or None when it is."""
    if not isinstance(schema, dict):
        return f"must be a JSON Schema object (a mapping), got {type(schema).__name__}"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as error:
        return f"is not valid JSON Schema at {field_path(error.absolute_path, 'schema')}: {error.message}"
    return None


def object_schema_problems(schema: object) -> str | None:
    """Why `schema` is not a usable JSON Schema of a JSON object (as parameters are), or None when it is."""
    problem = schema_problems(schema)
    if problem is None and isinstance(schema, dict) and schema.get("type") != "object":
        return "must have `type: object` at its root, because parameters are JSON objects"
    return problem


_INT_RANGE = (-(2**63), 2**64 - 1)
"""Integers a JSON document holds exactly (what orjson, which stores sessions, reads and writes)."""


def json_problem(value: Any, root: str = "output") -> str | None:
    """Where and why `value` is not a JSON value that reads back equal after encoding, or None.

    JSON values are None, bools, strings, finite numbers (integers within 64 bits), lists and mappings
    with string keys, nested freely. Tuples, sets, NaN, bytes and objects are not: each would come back
    changed (or not at all) from the store.
    """
    found = _json_problem(value)
    if found is None:
        return None
    path, reason = found
    return f"{field_path(path[::-1], root)}: {reason}"


_SCALARS = frozenset({str, bool, type(None)})
"""Types that are JSON as they are (checked by identity first: the common case, and the quick one)."""


def _json_problem(value: Any) -> tuple[list[str | int], str] | None:
    """(path reversed, reason) of the first non-JSON part of `value`, or None."""
    if type(value) in _SCALARS:
        return None
    if isinstance(value, int):  # bools were taken above
        low, high = _INT_RANGE
        return None if low <= value <= high else ([], f"{value} does not fit in 64 bits")
    if isinstance(value, float):
        return None if math.isfinite(value) else ([], f"{value} is not a finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return [], f"key {key!r} is not a string"
            if type(item) not in _SCALARS and (found := _json_problem(item)) is not None:
                found[0].append(key)
                return found
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            if type(item) not in _SCALARS and (found := _json_problem(item)) is not None:
                found[0].append(index)
                return found
        return None
    if isinstance(value, str | bool):
        return None
    kind = type(value).__name__
    return [], f"a {kind} is not a JSON value (use a list, a mapping, a string, a number, a bool or None)"


def field_path(path: Sequence[str | int], root: str) -> str:
    """`amount`, `filters[0].op`, or `root` for the whole value."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or root


def validation_errors(validator: SchemaValidator, value: Any, root: str = "params") -> tuple[str, ...]:
    """Every way `value` breaks the schema, as `field: rule` lines sorted by field."""
    if validator.is_valid(value):  # the common case stops at the first check, without building errors
        return ()
    errors = sorted(validator.full.iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path])
    lines = []
    for error in errors:
        message = error.message
        if len(message) > _MAX_MESSAGE:
            message = message[: _MAX_MESSAGE - 3] + "..."
        lines.append(f"{field_path(error.absolute_path, root)}: {message}")
    return tuple(lines)


def fill_defaults(schema: Json, value: Any) -> Any:
    """`value` with every missing property that has a `default` filled in, nested objects included."""
    properties = schema.get("properties")
    if not isinstance(value, dict) or not isinstance(properties, dict):
        return value
    filled = dict(value)
    for name, sub in properties.items():
        if not isinstance(sub, dict):
            continue
        if name in filled:
            filled[name] = fill_defaults(sub, filled[name])
        elif "default" in sub:
            filled[name] = sub["default"]
    return filled


def clip_numbers(schema: Json, value: Any, path: tuple[str | int, ...] = ()) -> tuple[Any, tuple[str, ...]]:
    """`value` with out-of-range numbers moved to their `minimum`/`maximum`, and one warning per change.

    Only inclusive bounds are clipped; an exclusive bound has no nearest valid number to move to.
    """
    if isinstance(value, bool):
        return value, ()
    if isinstance(value, int | float):
        return _clip_number(schema, value, path)
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        out, warnings = dict(value), list[str]()
        for name, sub in schema["properties"].items():
            if name in out and isinstance(sub, dict):
                out[name], found = clip_numbers(sub, out[name], (*path, name))
                warnings.extend(found)
        return out, tuple(warnings)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        pairs = [clip_numbers(schema["items"], item, (*path, i)) for i, item in enumerate(value)]
        return [item for item, _ in pairs], tuple(w for _, found in pairs for w in found)
    return value, ()


def _clip_number(schema: Json, number: float, path: tuple[str | int, ...]) -> tuple[Any, tuple[str, ...]]:
    is_integer = schema.get("type") == "integer"
    low, high = schema.get("minimum"), schema.get("maximum")
    if isinstance(low, int | float) and number < low:
        bound, name = (math.ceil(low) if is_integer else low), "minimum"
    elif isinstance(high, int | float) and number > high:
        bound, name = (math.floor(high) if is_integer else high), "maximum"
    else:
        return number, ()
    return bound, (f"{field_path(path, 'params')}: {number} clipped to the {name} of {bound}",)


def sample_instance(schema: Json) -> Any:
    """A small value that satisfies `schema` (defaults, first enum entries, lower bounds).

    Only required properties are filled; a schema that names no type (`{}`) gets None, which it accepts.
    Keywords it does not understand (`pattern`, `format`) can make the sample invalid; the result is
    checked and `ValueError` is raised then.
    """
    value = _sample(schema)
    if not validator_for(schema).is_valid(value):
        raise ValueError("cannot build a value that satisfies the schema")
    return value


def _sample(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return None
    for key in ("default", "const"):
        if key in schema:
            return schema[key]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return _sample(schema[key][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties", {})
        return {name: _sample(properties.get(name, {})) for name in schema.get("required", [])}
    if kind == "array":
        return [_sample(schema.get("items", {}))] * int(schema.get("minItems", 0))
    if kind in ("integer", "number"):
        return _sample_number(schema, kind == "integer")
    if kind == "string":
        text = "sample".ljust(int(schema.get("minLength", 0)), "s")
        return text[: schema["maxLength"]] if "maxLength" in schema else text
    return {"boolean": False}.get(str(kind))


def _sample_number(schema: Json, is_integer: bool) -> float:
    low: float | None = schema.get("minimum", schema.get("exclusiveMinimum"))
    high: float | None = schema.get("maximum", schema.get("exclusiveMaximum"))
    value: float
    if low is not None and "minimum" in schema:
        value = low
    elif low is not None and high is not None:
        value = (low + high) / 2
    elif low is not None:
        value = low + 1
    elif high is not None:
        value = min(high, 0) if "maximum" in schema else min(high - 1, 0)
    else:
        value = 0
    return math.ceil(value) if is_integer else value
