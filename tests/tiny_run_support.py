"""Tiny run configs for the tests that train through `RunConfig`: the smallest model, environment,
rollouts and evaluation a run goes through end to end, with each test's own sections laid over them."""

from __future__ import annotations

from typing import Any

TINY_RUN: dict[str, Any] = {
    "env": {"train": 16, "dev": 4, "test": 4},
    "model": {
        "tiny": {
            "vocab_size": 700,
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 2,
            "intermediate_size": 64,
        }
    },
    "rollout": {"max_steps": 3, "max_tool_chars": 120},
    "evaluation": {"tasks": 2, "gate_tasks": 2, "max_new_tokens": 16},
}
SFT_SECTION: dict[str, Any] = {"demos": 6, "trainer": {"steps": 2, "batch_sessions": 2, "token_budget": 2048}}
"""An `sft` section: a few demonstrations, two imitation steps."""


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` laid over it, mapping by mapping.

    >>> merged({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"c": 4}})
    {'a': {'b': 1, 'c': 4}, 'd': 3}
    """
    out = dict(base)
    for key, value in changes.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both else value
    return out


def tiny_run(**sections: Any) -> dict[str, Any]:
    """`TINY_RUN` with `sections` laid over it (see `merged`)."""
    return merged(TINY_RUN, sections)
