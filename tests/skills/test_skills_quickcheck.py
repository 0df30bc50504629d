"""The quick check of plain schemas agrees with jsonschema, and leaves every other schema to it."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from sessionrl.skills.quickcheck import quick_check
from sessionrl.skills.schema import validation_errors, validator_for

PLAIN: list[dict[str, Any]] = [
    {"type": "object"},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 1, "maximum": 9.5},
            "x": {"type": ["number", "null"], "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "unit": {"type": "string", "enum": ["mg", "g", None], "minLength": 1, "maxLength": 2},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
        },
        "additionalProperties": False,
    },
    {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 2},
    {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0}], "title": "either"},
    {"allOf": [{"minimum": 0}, {"maximum": 3}], "description": "no type: bounds judge numbers only"},
    {"const": "fixed"},
    {"type": "object", "properties": {"any": True, "none": False}},
    {},
]

keys = st.sampled_from(["n", "x", "unit", "tags", "ok", "any", "none", "z"])
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 12)
    | st.floats(-3, 12)
    | st.sampled_from([1.0, 2.0, float("nan"), float("inf"), "", "mg", "g", "fixed", "abc"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=8,
)
odd_values = st.sampled_from(
    [(1, 2), ("mg",), Decimal("0.5"), Decimal(50), {"n": Decimal(2)}, {"tags": ("a",)}]
)


@pytest.mark.parametrize("schema", PLAIN, ids=range(len(PLAIN)))
@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_quick_check_decides_json_values_as_jsonschema_does(schema: dict[str, Any], value: Any) -> None:
    quick = quick_check(schema)
    assert quick is not None
    assert quick(value) == Draft202012Validator(schema).is_valid(value)


@pytest.mark.parametrize("schema", PLAIN, ids=range(len(PLAIN)))
@settings(max_examples=50, deadline=None)
@given(value=odd_values)
def test_quick_yes_on_python_values_is_a_jsonschema_yes(schema: dict[str, Any], value: Any) -> None:
    """Tuples and Decimals are not JSON: the quick check may refuse what jsonschema takes, not the reverse."""
    quick = quick_check(schema)
    assert quick is not None
    if quick(value):
        assert Draft202012Validator(schema).is_valid(value)


def test_a_pattern_is_searched_as_jsonschema_searches_it() -> None:
    schema = {"type": "string", "pattern": "^SKU-[0-9]{5}$"}
    quick, validator = quick_check(schema), validator_for(schema)
    assert quick is not None
    for value in ("SKU-12345", "SKU-1234", "xSKU-12345", "SKU-123456"):
        assert quick(value) == validator.full.is_valid(value)
    assert quick_check({"type": "string", "pattern": 3}) is None


def test_booleans_are_neither_integers_nor_bounded_numbers() -> None:
    quick = quick_check({"type": "integer", "maximum": 0})
    assert quick is not None
    assert (quick(0), quick(0.0), quick(False), quick(-1.5)) == (True, True, False, False)
    enum = quick_check({"enum": ["a", None]})
    assert enum is not None
    assert (enum("a"), enum(None), enum(0), enum(False)) == (True, True, False, False)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "format": "email"},
        {"oneOf": [{"type": "string"}]},
        {"not": {"type": "string"}},
        {"enum": [1, True]},
        {"type": "array", "items": [{"type": "string"}]},
        {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
        {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}},
        {"type": "decimal"},
        {"minimum": "1"},
    ],
)
def test_other_keywords_are_left_to_jsonschema(schema: dict[str, Any]) -> None:
    assert quick_check(schema) is None


def test_the_validator_still_checks_formats_and_words_the_errors() -> None:
    schema = {"type": "object", "properties": {"mail": {"type": "string", "format": "email"}}}
    validator = validator_for(schema)
    assert validator.is_valid({"mail": "a@b.org"})
    assert validation_errors(validator, {"mail": "nope"}) == ("mail: 'nope' is not a 'email'",)


def test_a_quick_no_is_confirmed_by_jsonschema() -> None:
    """A Decimal is a number to jsonschema but not to the quick check, which defers to jsonschema."""
    validator = validator_for({"type": "object", "properties": {"n": {"type": "number", "maximum": 1}}})
    assert validator.is_valid({"n": Decimal("0.5")})
    expected = ("n: Decimal('2') is greater than the maximum of 1",)
    assert validation_errors(validator, {"n": Decimal(2)}) == expected
