"""What a CEL expression reads: free variables from the compiled program, fields from its tokens, with
macro variables, string literals and comments never mistaken for reads."""

from __future__ import annotations

from pathlib import Path

import cel
import pytest
from rewards_support import build, tool

from sessionrl.rewards.cel_reads import LITERAL, bound_names, expression_reads, merge_reads, tokens
from sessionrl.rewards.rules import compile_rules
from sessionrl.rewards.terms import ScoringContext
from sessionrl.session import CallStatus


def reads(expression: str) -> dict[str, frozenset[str] | None]:
    return expression_reads(cel.compile(expression))


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("!call.ok", {"call": {"ok"}}),
        ("call.latency_ms > budget_ms * weight", {"call": {"latency_ms"}, "budget_ms": None, "weight": None}),
        ("call.tool.startsWith('db') && call.attempt > 1", {"call": {"tool", "attempt"}}),
        ("has(call.error_code)", {"call": {"error_code"}}),
        ("feedback.data.reason == 'cycle'", {"feedback": {"data"}}),
        ("size(call) > 3", {"call": None}),
        ("call.size() > 3", {"call": None}),  # a method of the value itself: the whole value
        ('call["ok"]', {"call": None}),
        ("call.ok && size(call) > 3", {"call": None}),  # whole wins over fields
    ],
)
def test_fields_selected_from_each_variable(expression: str, expected: dict[str, set[str] | None]) -> None:
    assert reads(expression) == {k: None if v is None else frozenset(v) for k, v in expected.items()}


@pytest.mark.parametrize(
    "expression",
    [
        "session.tools.exists(t, t == 'x')",
        "session.tools.all(t, t != '')",
        "session.tools.exists_one(t, t == 'x')",
        "session.tools.map(t, t + '!').size() > 0",
        "session.tools.filter(t, t == 'x').size() > 0",
        "cel.bind(t, session.tools, size(t) > 0)",
    ],
)
def test_macro_variables_are_not_free(expression: str) -> None:
    assert "t" in cel.compile(expression).variables()  # the library lists it, hence the tokens
    assert "t" not in reads(expression)
    assert "t" in bound_names(tokens(expression))


@pytest.mark.parametrize(
    "expression",
    [
        "call.tool == 'session.tools'",
        'call.tool == "session.tools"',
        "call.tool == r'session.tools'",
        'call.tool == """session.tools"""',
        "call.tool == b'session.tools'",
        "call.tool == 'it\\'s session.tools'",
        "call.tool == 'x' // session.tools",
    ],
)
def test_text_in_literals_and_comments_is_not_a_read(expression: str) -> None:
    assert reads(expression) == {"call": frozenset({"tool"})}


def test_a_field_named_like_a_variable_is_not_that_variable() -> None:
    assert reads("feedback.data.session == 1") == {"feedback": frozenset({"data"})}


def test_tokens_turn_literals_into_one_placeholder() -> None:
    assert tokens("call.n > 1.5e3 && 'a.b' != r\"c.d\"") == [
        *("call", ".", "n", ">", LITERAL, "&", "&", LITERAL, "!", "=", LITERAL),
    ]


def test_merged_reads_keep_every_field_and_whole_use_wins() -> None:
    a = {"call": frozenset({"ok"}), "session": frozenset({"tools"})}
    b = {"call": frozenset({"tool"}), "session": None, "weight": None}
    assert merge_reads(a, b) == {"call": frozenset({"ok", "tool"}), "session": None, "weight": None}


RULE = """
name: reads
normalise: false
rules:
  - name: r
    for_each: tool_call
    when: {when}
    value: -1.0
    layer: completion
"""


@pytest.mark.parametrize(
    "when",
    [
        "'call.tool != \"call.latency\" && !call.ok'",  # a field-like text inside a string is no typo
        "'call.size() > 3 && !call.ok'",  # a method of the whole view is no field either
    ],
)
def test_rules_load_and_run_where_text_only_looks_like_a_field(tmp_path: Path, when: str) -> None:
    rules = compile_rules(RULE.format(when=when).encode(), "r", tmp_path)
    session = build([tool("t1", "db_query", CallStatus.ERROR)])
    ctx = ScoringContext(now=session.updated_at, params=rules.file)
    assert rules.terms[0].fn(session, ctx).value == -1.0
