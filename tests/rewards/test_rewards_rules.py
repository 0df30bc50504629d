"""Rule files: what loads, and how every kind of bad file is rejected with the rule and the problem named."""

from __future__ import annotations

from pathlib import Path

import pytest
from rewards_support import build, feedback, tool

from sessionrl.rewards.rules import RuleEvalError, RuleFileError, RuleSet, compile_rules, load_rules
from sessionrl.rewards.terms import ScoringContext
from sessionrl.rewards.views import SAMPLE_VIEWS, feedback_view, llm_call_view, session_view, tool_call_view
from sessionrl.session import CallStatus, FeedbackType, LLMCall

GOOD = """
name: tiny
scheme: five_layer
normalise: false
tool_weights: {db_query: 2.0}
rules:
  - name: tool_failure
    for_each: tool_call
    when: "!call.ok"
    value: -1.0 * weight
    layer: completion
  - name: rating
    for_each: feedback
    when: feedback.type == "human_rating" && feedback.score != null
    value: (feedback.score - 1.0) / 4.0
    layer: experience
"""


def load(text: str, tmp_path: Path) -> RuleSet:
    path = tmp_path / "rules.yaml"
    path.write_text(text, encoding="utf-8")
    return load_rules(path)


def test_the_shipped_rules_load_with_every_rule_the_brief_lists() -> None:
    rules = load_rules()
    names = {t.name for t in rules.terms}
    expected = {
        "tool_failure",
        "human_rating",
        "auto_validation",
        "hallucination",
        "plan_rejection",
        "sla_breach",
    }
    assert expected <= names
    assert rules.version.startswith("default@")
    assert rules.file.tool_weight("db_query") == 1.0
    assert rules.file.tool_weight("pdf_parse") == 0.5
    assert rules.file.tool_weight("anything_else") == 1.0


def test_version_is_name_and_content_hash(tmp_path: Path) -> None:
    first = compile_rules(GOOD.encode(), "a", tmp_path)
    again = compile_rules(GOOD.encode(), "b", tmp_path)
    edited = compile_rules(GOOD.replace("2.0}", "3.0}").encode(), "a", tmp_path)
    assert first.version == again.version
    assert first.version.startswith("tiny@")
    assert edited.version != first.version


def test_a_compiled_rule_runs_on_a_session(tmp_path: Path) -> None:
    rules = compile_rules(GOOD.encode(), "good", tmp_path)
    session = build([tool("t1", "db_query", CallStatus.ERROR)], [feedback(FeedbackType.HUMAN_RATING, 5.0)])
    ctx = ScoringContext(now=session.updated_at, params=rules.file)
    values = {t.name: t.fn(session, ctx).value for t in rules.terms}
    assert values == {"tool_failure": -2.0, "rating": 1.0}  # -1.0 × w(db_query)=2.0; (5 - 1) / 4


@pytest.mark.parametrize(
    ("text", "rule", "needle"),
    [
        ("name: x\nrules: [\n", None, "not valid YAML"),
        ("- just\n- a list\n", None, "must be a mapping"),
        (
            GOOD.replace("    layer: completion", "    layer: completion\n    weigth: 2"),
            "tool_failure",
            "weigth: unknown field",
        ),
        (
            GOOD.replace("scheme: five_layer", "scheme: five_layer\ncolour: red"),
            None,
            "colour: unknown field",
        ),
        (GOOD.replace("    value: -1.0 * weight\n", ""), "tool_failure", "value: missing"),
        (GOOD.replace('"!call.ok"', '"call.ok &&"'), "tool_failure", "when: CEL does not compile"),
        (
            GOOD.replace("(feedback.score - 1.0)", "(feedback.score - 1)"),
            "rating",
            "value fails on a sample feedback",
        ),
        (
            GOOD.replace('"!call.ok"', '"call.latency > 1.0"'),
            "tool_failure",
            "when: call has no field 'latency'",
        ),
        (GOOD.replace('"!call.ok"', '"call.attempt + 1.0 > 2.0"'), "tool_failure", "when fails on a sample"),
        (GOOD.replace('"!call.ok"', "call.latency_ms"), "tool_failure", "when must give a boolean"),
        (GOOD.replace("-1.0 * weight", "'\"minus one\"'"), "tool_failure", "value must give a number"),
        (
            GOOD.replace("-1.0 * weight", "-1.0 * feedback.score"),
            "tool_failure",
            "unknown variable(s) feedback",
        ),
        (GOOD.replace("layer: completion", "layer: fun"), "tool_failure", "unknown layer 'fun'"),
        (
            GOOD.replace("for_each: tool_call", "for_each: tool_call\n    discount: true"),
            "tool_failure",
            "feedback rules only",
        ),
        (GOOD.replace("for_each: tool_call", "for_each: everything"), "tool_failure", "for_each"),
        (GOOD.replace("name: rating", "name: tool_failure"), None, "names used twice"),
        (
            GOOD + "terms:\n  magic: {layer: risk}\n",
            None,
            "unknown term 'magic'; known terms are efficiency, judge_correction, predicted_rating, recovery",
        ),
        (GOOD + "layer_weights: {rule: 1.0}\n", None, "not layers of five_layer"),
        (GOOD + "penalties: missing.yaml\n", None, "penalties:"),
    ],
)
def test_bad_files_are_rejected_naming_rule_and_problem(
    tmp_path: Path, text: str, rule: str | None, needle: str
) -> None:
    with pytest.raises(RuleFileError) as info:
        load(text, tmp_path)
    assert info.value.rule == rule
    assert needle in str(info.value)
    assert str(tmp_path / "rules.yaml") in str(info.value)


def test_a_nameless_rule_is_named_by_position(tmp_path: Path) -> None:
    with pytest.raises(RuleFileError) as info:
        load(GOOD.replace("  - name: rating\n", "  - \n"), tmp_path)
    assert info.value.rule == "#2"


def test_macro_variables_are_not_mistaken_for_unknown_ones(tmp_path: Path) -> None:
    text = GOOD.replace('"!call.ok"', "session.tools.exists(t, t == call.tool) && !call.ok")
    rules = compile_rules(text.encode(), "r", tmp_path)
    session = build([tool("t1", "db_query", CallStatus.ERROR)])
    ctx = ScoringContext(now=session.updated_at, params=rules.file)
    assert rules.terms[0].fn(session, ctx).value == -2.0


def test_a_rule_that_breaks_on_real_data_names_rule_item_and_session(tmp_path: Path) -> None:
    text = GOOD.replace("(feedback.score - 1.0) / 4.0", "feedback.data.bonus * 1.0")
    rules = compile_rules(text.encode(), "r", tmp_path)  # KeyError on the sample is tolerated at load time
    session = build(fb=[feedback(FeedbackType.HUMAN_RATING, 3.0, feedback_id="f9")])
    ctx = ScoringContext(now=session.updated_at, params=rules.file)
    with pytest.raises(RuleEvalError, match=r"rule 'rating'.*'f9'.*session 's1'"):
        rules.terms[1].fn(session, ctx)


def test_one_context_reused_for_two_sessions_does_not_mix_them(tmp_path: Path) -> None:
    rules = compile_rules(GOOD.encode(), "good", tmp_path)
    failed = build([tool("t1", "db_query", CallStatus.ERROR)])
    fine = build([tool("t1", "db_query")])  # same ids, different content
    ctx = ScoringContext(now=failed.updated_at, params=rules.file)
    assert rules.terms[0].fn(failed, ctx).value == -2.0
    assert rules.terms[0].fn(fine, ctx).value == 0.0


def test_sample_views_have_exactly_the_fields_of_real_views() -> None:
    session = build([tool("t1")], [feedback(FeedbackType.HUMAN_RATING, 3.0)])
    assert SAMPLE_VIEWS["call_tool"].keys() == tool_call_view(session.tool_calls[0]).keys()
    assert SAMPLE_VIEWS["call_llm"].keys() == llm_call_view(LLMCall(call_id="l1")).keys()
    assert SAMPLE_VIEWS["feedback"].keys() == feedback_view(session.feedback[0]).keys()
    assert SAMPLE_VIEWS["session"].keys() == session_view(session).keys()


def test_rules_see_only_the_fields_they_read_but_bare_use_gets_everything(tmp_path: Path) -> None:
    rules = compile_rules(GOOD.encode(), "good", tmp_path)
    assert rules.terms[0].fn.needs["call"] == {"ok"}  # type: ignore[attr-defined]
    bare = GOOD.replace('"!call.ok"', '"!call.ok && size(call) > 3"')
    rules = compile_rules(bare.encode(), "bare", tmp_path)
    assert rules.terms[0].fn.needs["call"] is None  # type: ignore[attr-defined]
    session = build([tool("t1", "db_query", CallStatus.ERROR)])
    ctx = ScoringContext(now=session.updated_at, params=rules.file)
    assert rules.terms[0].fn(session, ctx).value == -2.0
