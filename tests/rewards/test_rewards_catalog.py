"""User reward terms: given to the engine or imported by the rule file, checked on registration, and
switched on by name; every mistake is refused with what to do instead."""

from __future__ import annotations

from pathlib import Path

import pytest
from rewards_support import build, tool
from rewards_user_terms import ANSWERED, answered, failed_lookups, not_a_result

from sessionrl.rewards import (
    PythonTerm,
    RewardConfig,
    RewardEngine,
    RuleFileError,
    RuleSource,
    TermCheckError,
    TermKind,
    term_catalog,
)
from sessionrl.session import CallStatus, Session

RULES = """
name: custom
scheme: {scheme}
normalise: false
terms:
{terms}
rules:
  - name: tool_failure
    for_each: tool_call
    when: "!call.ok"
    value: -1.0
    layer: completion
"""


def rules(tmp_path: Path, terms: str, scheme: str = "five_layer") -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES.format(scheme=scheme, terms=terms), encoding="utf-8")
    return path


def failing_session() -> Session:
    return build([tool("t1", "db_query", CallStatus.ERROR), tool("t2", "pdf_parse", CallStatus.ERROR)])


def test_a_user_term_scores_next_to_the_rules_in_the_layer_the_file_gives(tmp_path: Path) -> None:
    path = rules(tmp_path, "  failed_lookups: {layer: risk}")
    vector = RewardEngine(RewardConfig(rules=path), terms=[failed_lookups]).score(failing_session())
    (mine,) = [t for t in vector.terms if t.name == "failed_lookups"]
    assert (mine.value, mine.steps, mine.layer, mine.kind) == (-0.5, {"t1": -0.5}, "risk", TermKind.RULE)
    assert vector.layers["risk"].raw == -0.5
    assert vector.layers["completion"].raw == -2.0  # the CEL rule still runs: two failed calls


def test_a_mapping_names_terms_and_a_python_term_brings_its_kind(tmp_path: Path) -> None:
    path = rules(tmp_path, "  said_something: {layer: experience}", scheme="three_layer")
    engine = RewardEngine(RewardConfig(rules=path), terms={"said_something": ANSWERED})
    (mine,) = [t for t in engine.score(failing_session()).terms if t.name == "said_something"]
    assert (mine.kind, mine.layer) == (TermKind.MODEL, "model")  # three layers: the kind is the layer


def test_a_rule_file_naming_an_unknown_term_lists_the_known_ones(tmp_path: Path) -> None:
    path = rules(tmp_path, "  failed_lookup: {layer: risk}")
    with pytest.raises(RuleFileError) as info:
        RewardEngine(RewardConfig(rules=path), terms=[failed_lookups])
    message = str(info.value)
    assert "unknown term 'failed_lookup'" in message
    assert "efficiency, failed_lookups, judge_correction, predicted_rating, recovery" in message
    assert "RewardEngine(terms=...)" in message


def test_a_broken_user_term_is_refused_when_registered_with_the_fix() -> None:
    with pytest.raises(TermCheckError, match=r"term 'not_a_result' was refused: .*return TermResult\("):
        term_catalog([not_a_result])


@pytest.mark.parametrize(
    ("terms", "message"),
    [
        ([answered, answered], "'answered' is given twice"),
        ({"efficiency": answered}, "'efficiency' is a built-in term; give your term another name"),
        ([lambda s, c: None], "cannot be called '<lambda>'; name it in snake_case"),
        ({"Bad Name": answered}, "cannot be called 'Bad Name'"),
        ([42], "42 is not a term"),
    ],
)
def test_badly_named_or_duplicate_terms_are_refused(terms: object, message: str) -> None:
    with pytest.raises(TermCheckError, match=message.replace("(", r"\(").replace(")", r"\)")):
        term_catalog(terms)  # type: ignore[arg-type]


def test_a_given_term_the_file_does_not_switch_on_is_refused(tmp_path: Path) -> None:
    path = rules(tmp_path, "  efficiency: {layer: efficiency}")
    with pytest.raises(RuleFileError, match=r"\['answered'\] were given to the engine.*answered: \{layer"):
        RewardEngine(RewardConfig(rules=path), terms=[answered])


def test_a_rule_file_imports_a_term_by_module_and_function(tmp_path: Path) -> None:
    path = rules(tmp_path, "  lookups: {layer: risk, function: 'rewards_user_terms:failed_lookups'}")
    vector = RewardEngine(RewardConfig(rules=path)).score(failing_session())
    (mine,) = [t for t in vector.terms if t.name == "lookups"]
    assert (mine.value, mine.kind) == (-0.5, TermKind.RULE)
    kinded = rules(tmp_path, "  said: {layer: experience, function: 'rewards_user_terms:ANSWERED'}")
    (said,) = [t for t in RewardEngine(RewardConfig(rules=kinded)).ruleset.terms if t.name == "said"]
    assert said.kind is TermKind.MODEL


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("rewards_user_terms:not_a_result", "term 'x' was refused: not_a_result returned float"),
        ("rewards_user_terms:NOT_CALLABLE", "42 is not a term"),
        ("rewards_user_terms:missing", "module 'rewards_user_terms' has no 'missing'"),
        ("no_such_module_here:fn", "cannot import 'no_such_module_here'"),
        ("not a path", "function: String should match pattern"),
    ],
)
def test_a_bad_import_is_a_rule_file_error(tmp_path: Path, function: str, message: str) -> None:
    path = rules(tmp_path, f"  x: {{layer: risk, function: '{function}'}}")
    with pytest.raises(RuleFileError) as info:
        RewardEngine(RewardConfig(rules=path))
    assert message in str(info.value)


def test_importing_under_a_known_name_is_refused(tmp_path: Path) -> None:
    path = rules(tmp_path, "  efficiency: {layer: risk, function: 'rewards_user_terms:answered'}")
    with pytest.raises(RuleFileError, match="'efficiency' is already a known term"):
        RewardEngine(RewardConfig(rules=path))


def test_a_reloaded_file_still_knows_the_engines_terms(tmp_path: Path) -> None:
    path = rules(tmp_path, "  failed_lookups: {layer: risk}")
    source = RuleSource(path, term_catalog([failed_lookups]))
    path.write_text(path.read_text(encoding="utf-8").replace("layer: risk}", "layer: completion}"))
    reloaded = source.reload()
    assert [(t.name, t.layer) for t in reloaded.terms if t.name == "failed_lookups"] == [
        ("failed_lookups", "completion")
    ]


def test_a_python_term_renamed_by_a_mapping_keeps_its_function_and_kind() -> None:
    catalog = term_catalog({"said": ANSWERED})
    assert catalog["said"] == PythonTerm("said", answered, TermKind.MODEL)
