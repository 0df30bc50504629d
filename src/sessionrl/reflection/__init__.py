"""Reflection (capability level L5): a structured record of why an attempt failed, written by the judge's
offline extractor or by the policy, and put into the context of the retry."""

from sessionrl.reflection.extract import reflect
from sessionrl.reflection.record import (
    ANNOTATOR,
    GENERIC_PLANS,
    ROOT_CAUSE_QUESTION,
    Reflection,
    RootCause,
    cause_reflection,
    parse_root_cause,
    root_cause_answer,
    with_reflection,
)

__all__ = [
    "ANNOTATOR",
    "GENERIC_PLANS",
    "ROOT_CAUSE_QUESTION",
    "Reflection",
    "RootCause",
    "cause_reflection",
    "parse_root_cause",
    "reflect",
    "root_cause_answer",
    "with_reflection",
]
