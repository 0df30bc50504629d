"""Runs side by side: their curves overlaid (one series per run on each stage's metric), their evaluation
tables next to each other, paired tests between every two evaluated policies that ran the same tasks
(exact McNemar, `sessionrl.eval.significance`), and the config keys whose values differ."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionrl.store import SessionStore
from sessionrl.ui import curves, runs


@dataclass(frozen=True, slots=True)
class Comparison:
    """What the compare page shows for the chosen runs."""

    compared: list[runs.Run]
    charts: list[dict[str, Any]]
    columns: list[str]
    policies: list[tuple[str, dict[str, Any]]]
    """Each evaluated policy as `run / label` with its latest evaluation record."""
    tested: list[runs.Paired]
    apart: list[runs.Paired]
    config_diff: list[tuple[str, list[str]]]
    """Each config key whose value differs between the runs, with the value in each run."""


def compare(runs_dir: Path, names: Sequence[str]) -> Comparison:
    """Read and compare the runs `names` (unknown names are left out; the caller checks)."""
    found = [r for name in names if (r := runs.read_run(runs_dir, name)) is not None]
    charts = curves.overlays({r.name: r.metrics for r in found})
    policies = [(f"{r.name} / {e.get('label', '')}", e) for r in found for e in _by_label(r.evaluations)]
    columns = [c for c in runs.EVAL_COLUMNS if any(c in e for _, e in policies)]
    solved: dict[str, dict[str, bool]] = {}
    for run in found:
        url = runs.run_store_url(runs_dir, run.name)
        if url is not None:
            with SessionStore.open(url) as store:
                by_label = runs.outcomes(runs.evaluation_sessions(store))
            solved |= {f"{run.name} / {label}": tasks for label, tasks in by_label.items()}
    tested, apart = runs.paired(solved)
    return Comparison(found, charts, columns, policies, tested, apart, config_diff([r.config for r in found]))


def _by_label(evaluations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for record in evaluations:
        latest[str(record.get("label", ""))] = record
    return list(latest.values())


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys and their values as text.

    >>> flatten({"rl": {"iterations": 20, "trainer": {"lr": 0.0001}}, "seed": 0})
    {'rl.iterations': '20', 'rl.trainer.lr': '0.0001', 'seed': '0'}
    """
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= flatten(value, name + ".")
        else:
            out[name] = str(value)
    return out


def config_diff(configs: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """The keys whose values differ between the configs (a key one lacks shows as '—'), in key order;
    `run_dir` is left out (it always differs)."""
    flat = [flatten(c) for c in configs]
    keys = sorted({k for f in flat for k in f} - {"run_dir"})
    rows = [(k, [f.get(k, "—") for f in flat]) for k in keys]
    return [(k, values) for k, values in rows if len(set(values)) > 1]
