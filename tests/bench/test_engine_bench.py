"""bench/engine.py's summary from played episodes, worked out by hand: the logprob agreement on the tokens
both samplers wrote, tokens per second and per CPU-second, and the JSON keys the issue names."""

from __future__ import annotations

import argparse

import orjson
import pytest

import engine


def played(
    label: str, replies: list[list[tuple[tuple[int, ...], tuple[float, ...]]]], seconds: float
) -> engine.Played:
    return engine.Played(label, replies, seconds, cpu_seconds=seconds * 2, prefilled=10, reused=5)


OURS = [[((5, 6, 2), (-0.5, -1.0, -0.25)), ((7, 2), (-2.0, -0.125))]]
# row 0: the same three tokens, logprobs 0.25, 0, 0.75 away; row 1: the second token differs, so only the
# first counts (0.5 away)
THEIRS = [[((5, 6, 2), (-0.25, -1.0, -1.0)), ((7, 9), (-1.5, -3.0))]]


def test_agreement_counts_each_rows_common_prefix_only() -> None:
    mae, worst, same = engine.agreement(played("x", THEIRS, 1.0), played("ours", OURS, 1.0))
    assert mae == pytest.approx((0.25 + 0.0 + 0.75 + 0.5) / 4)
    assert worst == pytest.approx(0.75)
    assert same == 0.5


def test_the_json_line_names_the_engine_and_its_ratio_to_todays_sampler(
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = {"ours": played("ours", OURS, 2.5), "ortgenai": played("ortgenai", THEIRS, 0.5)}
    args = argparse.Namespace(batch=2, turns=1, new_tokens=3)
    engine.report(runs, {"ortgenai": 3.0}, "ortgenai", args, [10, 12], "tiny")
    summary = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["engine"] == "ortgenai"
    assert summary["engine_tok_s"] == 10.0  # 5 tokens in 0.5 s
    assert summary["ours_tok_s"] == 2.0  # 5 tokens in 2.5 s
    assert summary["ratio"] == 5.0
    assert summary["logprob_mae"] == pytest.approx(0.375)
    assert summary["refresh_s"] == 3.0
    assert summary["engines"]["ortgenai"]["tok_cpu_s"] == 5.0  # 5 tokens in 1 CPU-second
    assert summary["engines"]["ours"]["mae"] == 0.0
