"""Whether an orders episode resolved its ticket: the pattern, nothing extra, nothing risky, the facts said.

Four criteria (`Outcome.checks`):
- `pattern`: every step of `expert.pattern` was matched by a successful call with the right parameters,
  after the calls that matched its dependencies;
- `no_extra_actions`: no refund, new shipment or address change beyond those the pattern asks for;
- `no_risk`: no call raised a risk flag;
- `message`: some message to the customer states every key fact.

Parameters match exactly, except money (within 1% of the order amount, at least one cent, so a bounded
continuous policy can hit it), addresses (compared ignoring case, commas and spacing) and the ERP
timestamp (any time the tool accepted).
"""

from __future__ import annotations

import functools
import string
from collections.abc import Mapping, Sequence
from typing import Any, Final

from sessionrl.envs.base import EXTRA_CALLS, RISKY, ExpertStep, Outcome
from sessionrl.envs.orders.expert import Facts, amount_spellings, key_facts, pattern
from sessionrl.envs.orders.ticket import IssueType, Ticket
from sessionrl.envs.orders.tools import World

EFFECTFUL: Final = frozenset({"order_update_address", "refund_trigger", "waybill_generate"})
"""Tools whose calls move money, goods or addresses: an unasked-for one spoils the resolution."""

WORD_CHARS: Final = frozenset(string.ascii_letters + string.digits + "_")
"""Characters that may not touch a fact said in a message (it would be part of a longer word or number)."""

AMOUNT_TOLERANCE: Final = 0.01
"""Share of the order amount a refund (or a stated amount) may be off by."""


def normal_text(text: str) -> str:
    """Text folded for comparison: lower case, no commas, single spaces.

    >>> normal_text("88  Nanjing Road, Shanghai")
    '88 nanjing road shanghai'
    """
    return " ".join(text.casefold().replace(",", " ").split())


def said(fact: str, message: str) -> bool:
    """True when `fact` appears in `message` (both folded by `normal_text`), not inside a longer word or
    number: no ASCII letter or digit touches it, and a number is not cut from a longer decimal.

    >>> said("23.4", "we refunded 23.40 yuan"), said("23.40", "we refunded 23.40 yuan")
    (False, True)
    """
    needle, text = normal_text(fact), normal_text(message)
    start = text.find(needle)
    while start >= 0:
        end = start + len(needle)
        before, after = text[start - 1 : start] if start else "", text[end : end + 2]
        touched = before in WORD_CHARS | {"."} if before else False
        touched = touched or (after[:1] in WORD_CHARS if after else False)
        if not touched and not (after[:1] == "." and after[1:2].isdecimal()):
            return True
        start = text.find(needle, start + 1)
    return False


def tolerance(ticket: Ticket) -> float:
    """How far a refund amount may be from the expected one."""
    return max(0.01, AMOUNT_TOLERANCE * ticket.amount)


def _amount_matches(want: Any, got: Any, ticket: Ticket) -> bool:
    try:
        return abs(float(got) - float(want)) <= tolerance(ticket) + 1e-9
    except (TypeError, ValueError):
        return False


def _variables_match(want: Mapping[str, str], got: Any, ticket: Ticket) -> bool:
    if not isinstance(got, Mapping):
        return False
    for name, value in want.items():
        if name == "amount":
            if not _amount_matches(value, got.get(name), ticket):
                return False
        elif normal_text(str(got.get(name, ""))) != normal_text(value):
            return False
    return True


def params_match(step: ExpertStep, params: Mapping[str, Any], ticket: Ticket) -> bool:
    """Whether a call's parameters do what `step` asks (see the module doc for the leniencies)."""
    for name, want in step.params.items():
        got = params.get(name)
        if name == "timestamp":
            continue
        if name == "amount":
            ok = _amount_matches(want, got, ticket)
        elif name == "variables":
            ok = _variables_match(want, got, ticket)
        elif name == "new_address":
            ok = isinstance(got, str) and normal_text(got) == normal_text(want)
        else:
            ok = got == want
        if not ok:
            return False
    return True


def match_pattern(
    steps: Sequence[ExpertStep], calls: Sequence[tuple[str, Mapping[str, Any], Any]], ticket: Ticket
) -> tuple[dict[str, int], list[ExpertStep]]:
    """Each step's matching call index (the earliest unused one after its dependencies' matches), and the
    steps no call matched."""
    matched: dict[str, int] = {}
    missing: list[ExpertStep] = []
    for step in steps:
        if not set(step.depends_on) <= matched.keys():
            missing.append(step)
            continue
        after = max((matched[dep] for dep in step.depends_on), default=-1)
        used = set(matched.values())
        index = next(
            (
                i
                for i, (tool, params, _) in enumerate(calls)
                if i > after and i not in used and tool == step.tool and params_match(step, params, ticket)
            ),
            None,
        )
        if index is None:
            missing.append(step)
        else:
            matched[step.id] = index
    return matched, missing


def unsaid(facts: Facts, messages: Sequence[str]) -> list[str]:
    """The facts (by their first spelling) that no message states."""
    return [fact[0] for fact in facts if not any(said(f, m) for f in fact for m in messages)]


def _with_refunded_amount(facts: Facts, world: World) -> Facts:
    """Let the reply state the amount actually refunded when that refund was within tolerance.

    The pattern accepts a refund a little off the expected amount; the reply is right to state what was
    really refunded, so that spelling counts for the refund fact too.
    """
    ticket = world.ticket
    if ticket.issue not in (IssueType.DAMAGED_ITEM, IssueType.LATE_DELIVERY):
        return facts  # no refund is due, so no refund fact to restate
    refunds = [float(params["amount"]) for tool, params, _ in world.calls if tool == "refund_trigger"]
    if not refunds or not _amount_matches(ticket.refund_amount(), refunds[-1], ticket):
        return facts
    want = amount_spellings(ticket.refund_amount())
    got = amount_spellings(refunds[-1])
    return tuple(tuple(dict.fromkeys(fact + got)) if fact == want else fact for fact in facts)


@functools.lru_cache(maxsize=4096)
def expected(ticket: Ticket) -> tuple[tuple[ExpertStep, ...], Facts]:
    """The pattern and the key facts of `ticket`, built once per ticket: every episode of a task is judged
    against the same ones, and building them cost as much as the rest of a judgement. Read them only."""
    return pattern(ticket), key_facts(ticket)


def judge(world: World, messages: Sequence[str]) -> Outcome:
    """Judge an episode's world and the messages sent to the customer (see the module doc)."""
    ticket = world.ticket
    steps, key = expected(ticket)
    matched, missing = match_pattern(steps, world.calls, ticket)
    used = set(matched.values())
    extra = [tool for i, (tool, _, _) in enumerate(world.calls) if tool in EFFECTFUL and i not in used]
    facts = unsaid(_with_refunded_amount(key, world), messages)
    details = [f"no call did {step.id} ({step.description})" for step in missing]
    details += [f"unasked-for {tool} call" for tool in extra]
    details += [f"risky: {flag}" for flag in world.risk_flags]
    details += [f"never told the customer {fact!r}" for fact in facts]
    checks = {
        "pattern": not missing,
        "no_extra_actions": not extra,
        "no_risk": not world.risk_flags,
        "message": not facts,
    }
    findings = {EXTRA_CALLS: tuple(extra), RISKY: tuple(world.risk_flags)}
    return Outcome(
        checks=checks, detail="; ".join(details), findings={k: v for k, v in findings.items() if v}
    )
