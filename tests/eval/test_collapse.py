"""The collapse watch on hand-made metric sequences: a collapse is called after `patience` unhealthy
iterations in a row against the first (the imitation policy's), noise and recoveries are not, and the last
healthy iteration is remembered."""

from __future__ import annotations

import pytest

from sessionrl.episodes.llm import UNPARSEABLE
from sessionrl.eval.collapse import CollapseConfig, CollapseWatch, Health, unparseable_share
from sessionrl.session import Feedback, FeedbackType, LLMCall, Session

BASE = Health(success=0.30, unparseable=0.05, tcsr=0.80, kl=0.01)


def watched(healths: list[Health], **config: object) -> tuple[CollapseWatch, list[bool]]:
    watch = CollapseWatch(CollapseConfig.model_validate(config))
    return watch, [watch.observe(i, h).collapsed for i, h in enumerate(healths)]


def test_orders_grpo_as_reported_collapses_on_the_third_unhealthy_iteration() -> None:
    # what examples/orders-grpo.yaml did: success 0.30 -> 0, every reply unparseable, no tool call left
    dead = Health(success=0.0, unparseable=1.0, tcsr=None, kl=0.02)
    watch, collapsed = watched([BASE, dead, dead, dead, dead])
    assert collapsed == [False, False, False, True, True]
    assert watch.last_good == 0
    problems = watch.streak[-1].problems
    assert len(problems) == 3  # success, TCSR (no call: 0) and parse; the KL is fine
    assert "100% of replies unparseable (imitation: 5%)" in problems
    # the console counts from 1: the streak is the records' iterations 1-4
    assert watch.describe().startswith("iterations 2-5: rollout success 0.00 < 0.5 x imitation's 0.30")


def test_noise_around_the_imitation_policy_is_healthy() -> None:
    # success 0.16 is above 0.5 x 0.30 = 0.15; unparseable 0.29 is under 0.05 + 0.25 = 0.30; TCSR 0.41 > 0.40
    noisy = [Health(0.16, 0.29, 0.41, 0.9), Health(0.45, 0.0, 0.95), Health(0.20, 0.10, 0.60)]
    watch, collapsed = watched([BASE, *noisy])
    assert collapsed == [False] * 4
    assert watch.last_good == 3
    assert watch.streak == []


@pytest.mark.parametrize(
    ("bad", "rule"),
    [
        (Health(0.14, 0.05, 0.80), "rollout success 0.14 < 0.5 x imitation's 0.30"),
        (Health(0.30, 0.05, 0.39), "TCSR 0.39 < 0.5 x imitation's 0.80"),
        (Health(0.30, 0.31, 0.80), "31% of replies unparseable (imitation: 5%)"),
        (Health(0.30, 0.05, 0.80, kl=1.5), "KL 1.5 > 1"),
    ],
)
def test_each_rule_alone_makes_an_iteration_unhealthy(bad: Health, rule: str) -> None:
    watch, collapsed = watched([BASE, bad, bad, bad])
    assert collapsed == [False, False, False, True]
    assert watch.streak[-1].problems == (rule,)


def test_a_healthy_iteration_breaks_the_streak_and_becomes_the_last_good() -> None:
    bad = Health(0.0, 0.9, 0.1)
    watch, collapsed = watched([BASE, bad, bad, BASE, bad, bad, bad])
    assert collapsed == [False, False, False, False, False, False, True]
    assert watch.last_good == 3
    assert [v.iteration for v in watch.streak] == [4, 5, 6]


def test_patience_and_thresholds_are_configurable() -> None:
    bad = Health(0.25, 0.05, 0.80)  # 0.25 < 0.9 x 0.30 = 0.27
    assert watched([BASE, bad], patience=1, success_ratio=0.9)[1] == [False, True]
    assert watched([BASE, bad], patience=1)[1] == [False, False]  # the default ratio 0.5: 0.25 >= 0.15


def test_a_disabled_watch_judges_but_never_calls_a_collapse() -> None:
    dead = Health(0.0, 1.0)
    watch, collapsed = watched([BASE, dead, dead, dead], enabled=False)
    assert collapsed == [False] * 4
    assert len(watch.streak) == 3
    assert not watch.unsettled  # three in a row: no longer too few to tell, though nothing acted on it
    short, _ = watched([BASE, dead, dead], enabled=False)
    assert short.unsettled


def test_an_imitation_policy_that_never_succeeds_is_judged_on_parse_and_tcsr_alone() -> None:
    weak = Health(success=0.0, unparseable=0.5, tcsr=0.35)
    same = Health(success=0.0, unparseable=0.6, tcsr=0.30)
    dead = Health(success=0.0, unparseable=1.0, tcsr=None)
    assert watched([weak, same, same, same])[1] == [False] * 4
    assert watched([weak, dead, dead, dead])[1] == [False, False, False, True]


def test_the_watch_names_the_rules_its_baseline_leaves_unable_to_fire() -> None:
    assert CollapseWatch(CollapseConfig()).blind == ()  # no baseline yet
    assert watched([BASE])[0].blind == ()
    # no task solved: 0.5 x 0 is 0, and no success falls below it (the seed-1 baseline of SmolLM2's GRPO)
    (success,) = watched([Health(0.0, 0.05, 0.80)])[0].blind
    assert success.startswith("rollout success")
    assert watched([Health(0.0, 0.05, 0.80)], success_ratio=0)[0].blind == ()  # switched off, not blind
    # no call went through (none made, or all failed); replies that are already mostly no action
    for tcsr in (None, 0.0):
        (tool,) = watched([Health(0.3, 0.05, tcsr)])[0].blind
        assert tool.startswith("TCSR")
    (parse,) = watched([Health(0.3, 0.80, 0.8)])[0].blind
    assert parse == "unparseable replies (the baseline's 80% leaves no room for a rise of 25%)"
    assert watched([Health(0.3, 0.80, 0.8)], unparseable_rise=0.1)[0].blind == ()


def test_health_from_a_record_reads_what_as_record_added() -> None:
    record = {"iteration": 2, "success": 0.25, "approx_kl": 0.02, **Health(0.25, 0.1, 0.7).as_record()}
    assert Health.from_record(record) == Health(0.25, 0.1, 0.7, 0.02)
    assert Health.from_record({"success": 0.5, "kl_ref": 0.3, "approx_kl": 0.01}).kl == 0.3
    assert Health.from_record({"success": 0.5}) == Health(0.5, 0.0)  # a record from before the watch


def _session(replies: int, refused: int) -> Session:
    calls = tuple(LLMCall(call_id=f"c{i}") for i in range(replies))
    feedback = tuple(
        Feedback(type=FeedbackType.AUTO_VALIDATION, score=0.0, comment=f"{UNPARSEABLE}: not an action")
        for _ in range(refused)
    )
    other = Feedback(type=FeedbackType.AUTO_VALIDATION, score=0.0, comment="schema check failed")
    return Session(
        session_id="s",
        trace_id="t",
        user_query="q",
        llm_calls=calls,
        feedback=(*feedback, other),
        created_at="2026-01-01T00:00:00Z",
        updated_at="2026-01-01T00:00:00Z",
    )


def test_unparseable_share_counts_the_parser_refusals_over_all_replies() -> None:
    assert unparseable_share([_session(4, 1), _session(4, 3)]) == 0.5  # (1 + 3) / (4 + 4)
    assert unparseable_share([_session(0, 0)]) == 0.0
