"""Reward shaping: rules → discount → judge refinement → weighted layers → versioned reward vectors.

Sparse-feedback tools (reward model, annotation queue, curriculum) live in `sessionrl.rewards.sparse`,
which imports scikit-learn (the `train` extra); `sessionrl rewards queue` and
`examples/rewards/late_feedback.py` use them.

>>> from sessionrl.rewards import RewardEngine
>>> engine = RewardEngine()
>>> engine.ruleset.name
'default'
"""

from sessionrl.rewards.catalog import UserTerms, term_catalog
from sessionrl.rewards.checker import TermCheckError, check_reward_term, sample_sessions
from sessionrl.rewards.engine import RewardConfig, RewardEngine
from sessionrl.rewards.judge import Correction, JudgeConfig, JudgeRunner, PenaltyTable, Severity
from sessionrl.rewards.layers import RunningStats, Scheme, TermKind
from sessionrl.rewards.rules import (
    RuleEvalError,
    RuleFile,
    RuleFileError,
    RuleSet,
    RuleSpec,
    compile_rules,
    default_rules_path,
    load_rules,
)
from sessionrl.rewards.source import RuleSource
from sessionrl.rewards.terms import (
    BUILTIN_TERMS,
    Params,
    PythonTerm,
    RatingPredictor,
    ScoringContext,
    Term,
    TermFn,
    TermResult,
    discount,
)
from sessionrl.rewards.vector import LayerValue, RewardVector, TermContribution

__all__ = [
    "BUILTIN_TERMS",
    "Correction",
    "JudgeConfig",
    "JudgeRunner",
    "LayerValue",
    "Params",
    "PenaltyTable",
    "PythonTerm",
    "RatingPredictor",
    "RewardConfig",
    "RewardEngine",
    "RewardVector",
    "RuleEvalError",
    "RuleFile",
    "RuleFileError",
    "RuleSet",
    "RuleSource",
    "RuleSpec",
    "RunningStats",
    "Scheme",
    "ScoringContext",
    "Severity",
    "Term",
    "TermCheckError",
    "TermContribution",
    "TermFn",
    "TermKind",
    "TermResult",
    "UserTerms",
    "check_reward_term",
    "compile_rules",
    "default_rules_path",
    "discount",
    "load_rules",
    "sample_sessions",
    "term_catalog",
]
