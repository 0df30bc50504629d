"""A quick yes for plain JSON Schemas: the per-call check of parameters and outputs without jsonschema.

`quick_check(schema)` turns a schema written with the common keywords (types, properties, required,
additional properties, items, bounds, lengths, patterns, string enums, anyOf/allOf) into a predicate built
once. Its promise is one-sided: when it says yes, jsonschema (2020-12) says yes too; when it says no, the
caller asks jsonschema, which decides and words the errors. A schema with any other keyword (`format`,
`$ref`, `oneOf`, `not`, ...) gets None: it is checked by jsonschema alone.

>>> accepts = quick_check({"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}})
>>> accepts({"n": 2}), accepts({"n": 2.0}), accepts({"n": 4}), accepts({"n": True})
(True, True, False, False)
>>> quick_check({"type": "string", "format": "email"}) is None
True
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Mapping, Sized
from typing import Any

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}
)
_TYPES: dict[str, Check] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    # only int and float: other numbers (Decimal, Fraction) get a no, and jsonschema decides
    "number": lambda v: type(v) is int or type(v) is float,
    "integer": lambda v: type(v) is int or (type(v) is float and v.is_integer()),
}
_BOUNDS: dict[str, Callable[[float, float], bool]] = {
    "minimum": lambda v, b: not v < b,
    "maximum": lambda v, b: not v > b,
    "exclusiveMinimum": lambda v, b: not v <= b,
    "exclusiveMaximum": lambda v, b: not v >= b,
}
_SIZES: dict[str, tuple[type[Sized], bool]] = {  # keyword: (the type it bounds, whether a minimum)
    "minLength": (str, True),
    "maxLength": (str, False),
    "minItems": (list, True),
    "maxItems": (list, False),
    "minProperties": (dict, True),
    "maxProperties": (dict, False),
}


class _Unsupported(Exception):
    """The schema uses a keyword (or a form of one) this module does not check."""


def quick_check(schema: Any) -> Check | None:
    """A predicate whose yes jsonschema shares, or None when the schema is not plain enough (see above)."""
    try:
        return _compile(schema)
    except _Unsupported:
        return None


def _compile(schema: Any) -> Check:
    if isinstance(schema, bool):
        return lambda v: schema
    if not isinstance(schema, Mapping):
        raise _Unsupported
    found = (_keyword(key, value, schema) for key, value in schema.items() if key not in _ANNOTATIONS)
    checks = [check for check in found if check is not None]
    if len(checks) == 1:
        return checks[0]

    return lambda v: all(check(v) for check in checks)


def _keyword(key: str, value: Any, schema: Mapping[str, Any]) -> Check | None:
    """The check of one keyword; None for one checked together with another (additionalProperties)."""
    if key == "type":
        return _type(value)
    if key == "properties":
        return _properties(value, schema.get("additionalProperties", True))
    if key == "additionalProperties":
        return None if "properties" in schema else _properties({}, value)
    if key == "required":
        if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
            raise _Unsupported
        names = tuple(value)
        return lambda v: not isinstance(v, dict) or all(name in v for name in names)
    if key == "items":
        item = _compile(value)
        return lambda v: not isinstance(v, list) or all(item(x) for x in v)
    if key in ("enum", "const"):
        return _choice(value if key == "enum" else [value])
    if key == "pattern":
        if not isinstance(value, str):
            raise _Unsupported
        compiled = re.compile(value)  # jsonschema also searches with Python's re
        return lambda v: not isinstance(v, str) or compiled.search(v) is not None
    if key in ("anyOf", "allOf"):
        if not isinstance(value, list) or not value:
            raise _Unsupported
        subs = [_compile(sub) for sub in value]
        pick = any if key == "anyOf" else all
        return lambda v: pick(sub(v) for sub in subs)
    return _bound(key, value)


def _type(value: Any) -> Check:
    names = value if isinstance(value, list) else [value]
    if not names or not all(isinstance(name, str) and name in _TYPES for name in names):
        raise _Unsupported
    checks = [_TYPES[name] for name in names]
    if len(checks) == 1:
        return checks[0]
    return lambda v: any(check(v) for check in checks)


def _properties(properties: Any, additional: Any) -> Check:
    """`properties` and `additionalProperties` together: extra keys are judged by the latter."""
    if not isinstance(properties, Mapping):
        raise _Unsupported
    subs = {name: _compile(sub) for name, sub in properties.items()}
    extra = None if additional is True else _compile(additional)  # False compiles to "never"

    def holds(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        for name, item in v.items():
            sub = subs.get(name)
            if sub is not None:
                if not sub(item):
                    return False
            elif extra is not None and not extra(item):
                return False
        return True

    return holds


def _choice(values: Any) -> Check:
    """`enum`/`const` of strings and nulls only: there `in` agrees with jsonschema (no 1 == True)."""
    if not isinstance(values, list) or not all(value is None or type(value) is str for value in values):
        raise _Unsupported
    allowed = tuple(values)
    return lambda v: (v is None or type(v) is str) and v in allowed


def _bound(key: str, value: Any) -> Check:
    if key in _BOUNDS:
        if type(value) not in (int, float):
            raise _Unsupported
        within = _BOUNDS[key]

        def bounded(v: Any) -> bool:
            if type(v) is int or type(v) is float:
                return within(v, value)
            # booleans and non-numbers are not bounded; other numbers get a no, and jsonschema decides
            return isinstance(v, bool) or not isinstance(v, numbers.Number)

        return bounded
    if key in _SIZES:
        if type(value) is not int:
            raise _Unsupported
        kind, at_least = _SIZES[key]
        if at_least:
            return lambda v: not isinstance(v, kind) or len(v) >= value
        return lambda v: not isinstance(v, kind) or len(v) <= value
    raise _Unsupported
