"""Schema helpers: error paths, defaults, clipping and sample instances."""

from __future__ import annotations

from typing import Any

import pytest
from skills_support import EXAMPLES

from sessionrl.skills import load_contracts
from sessionrl.skills.schema import (
    clip_numbers,
    fill_defaults,
    json_problem,
    sample_instance,
    validation_errors,
    validator_for,
)

NESTED = {
    "type": "object",
    "properties": {
        "filters": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["op"],
                "properties": {
                    "op": {"type": "string", "enum": ["eq", "lt"]},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 9.5, "default": 5},
                    "ratio": {"type": "number", "exclusiveMaximum": 1},
                },
            },
        },
        "options": {"type": "object", "properties": {"deep": {"type": "boolean", "default": False}}},
    },
}


def test_errors_name_nested_paths():
    value = {"filters": [{"op": "eq"}, {"op": "gt", "limit": 0}]}
    assert validation_errors(validator_for(NESTED), value) == (
        "filters[1].limit: 0 is less than the minimum of 1",
        "filters[1].op: 'gt' is not one of ['eq', 'lt']",
    )


def test_long_messages_are_cut():
    schema = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 3}}}
    (line,) = validation_errors(validator_for(schema), {"note": "x" * 1000})
    assert line.startswith("note: 'xxx")
    assert line.endswith("...")
    assert len(line) == len("note: ") + 200


def test_defaults_fill_nested_objects_without_touching_the_input():
    value = {"options": {}}
    assert fill_defaults(NESTED, value) == {"options": {"deep": False}}
    assert value == {"options": {}}


def test_clipping_rounds_integer_bounds_and_leaves_exclusive_bounds_alone():
    value = {"filters": [{"op": "eq", "limit": 50, "ratio": 3.0}]}
    clipped, warnings = clip_numbers(NESTED, value)
    assert clipped == {"filters": [{"op": "eq", "limit": 9, "ratio": 3.0}]}  # floor(9.5) = 9 stays an integer
    assert warnings == ("filters[0].limit: 50 clipped to the maximum of 9",)
    assert value["filters"][0]["limit"] == 50


def test_booleans_are_not_numbers_for_clipping():
    schema = {"type": "object", "properties": {"flag": {"type": "number", "maximum": 0}}}
    assert clip_numbers(schema, {"flag": True}) == ({"flag": True}, ())


SCHEMAS = [
    (name, part)
    for name in ("crp_test_request", "db_query", "pdf_parse", "pdf_text_extract")
    for part in ("input_schema", "output_schema")
    if (name, part) != ("db_query", "input_schema")  # its `pattern` is beyond samples; see the next test
]


@pytest.mark.parametrize(("name", "part"), SCHEMAS)
def test_sample_instances_of_the_example_schemas_are_valid(name: str, part: str):
    schema = getattr(load_contracts(EXAMPLES)[name], part)
    sample = sample_instance(schema)
    assert isinstance(sample, dict)
    assert validator_for(schema).is_valid(sample)


def test_a_sample_that_cannot_satisfy_a_pattern_is_refused():
    schema = {
        "type": "object",
        "required": ["code"],
        "properties": {"code": {"type": "string", "pattern": "^[0-9]+$"}},
    }
    with pytest.raises(ValueError, match="cannot build"):
        sample_instance(schema)


@pytest.mark.parametrize(
    ("schema", "sample"),
    [({}, None), ({"type": "array"}, []), ({"type": "string"}, "sample"), ({"type": "null"}, None)],
)
def test_output_schemas_of_any_root_type_have_samples(schema: dict[str, Any], sample: object):
    assert sample_instance(schema) == sample


@pytest.mark.parametrize(
    "value", [None, True, 3, -(2**63), 2.5, "ok", [], [1, "a", None], {"a": [{"b": 1.0}]}, {}]
)
def test_json_values_pass(value: object):
    assert json_problem(value) is None


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ((1, 2), "output: a tuple"),
        ({"a": {1, 2}}, "a: a set"),
        ([0, {"x": float("nan")}], "[1].x: nan is not a finite number"),
        ({"n": 2**64}, "n: 18446744073709551616 does not fit"),
        ({1: "a"}, "output: key 1 is not a string"),
        ({"b": b"raw"}, "b: a bytes"),
    ],
)
def test_values_that_would_not_read_back_equal_are_named(value: object, where: str):
    problem = json_problem(value)
    assert problem is not None
    assert problem.startswith(where)
