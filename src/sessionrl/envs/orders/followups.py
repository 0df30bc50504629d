"""Multi-turn conversations: a ticket, then a follow-up ticket from the same customer about the same order.

The follow-up's header leaves out what the customer already gave in the first turn: the order number, and
the waybill when the first turn showed it. An agent must carry them over from the earlier turn (long-term
memory, capability level L4) to resolve the follow-up. Two chains:

    late delivery  ──▶ lost parcel     the late parcel never came: trace it, ship a replacement
    wrong address  ──▶ late delivery   the redirected order shipped but is late: expedite, compensate

A follow-up task's payload is its ticket plus a `conversation` entry (`Conversation`): the first turn's
task id and the entities the follow-up needs but does not name (`remembered`).
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from sessionrl.envs.base import Split, Task
from sessionrl.envs.orders.tasks import CATEGORIES, DAY, draw_ticket, instruction
from sessionrl.envs.orders.ticket import IssueType, OrderStatus, Ticket, waybill_number

CHAINS: Final[Mapping[IssueType, IssueType]] = {
    IssueType.LATE_DELIVERY: IssueType.LOST_PARCEL,
    IssueType.WRONG_ADDRESS: IssueType.LATE_DELIVERY,
}

WORDS: Final[Mapping[IssueType, tuple[str, ...]]] = {
    IssueType.LOST_PARCEL: (
        "It's me again about my late {product}. It still hasn't come and tracking hasn't moved for "
        "{days_late} days. I think it's lost.",
        "Following up on the {product} you expedited: nothing arrived and there's been no scan for "
        "{days_late} days.",
        "我又来了：之前催过的{product}还是没到，物流{days_late}天没更新了，是不是丢了？",
    ),
    IssueType.LATE_DELIVERY: (
        "Hello again! You changed the address of my {product} for me, but it is now {days_late} days late.",
        "About the {product} I redirected last time: it shipped but it's {days_late} days overdue.",
        "上次改了地址的{product}已经晚了{days_late}天了，请帮忙催一下。",
    ),
}
"""The customer's words for each follow-up issue: they name the item, never the order."""


@dataclass(frozen=True, slots=True)
class Conversation:
    """Where a follow-up sits in its conversation: the first turn, and what it must carry over."""

    first: str
    """Task id of the first turn."""
    remembered: tuple[str, ...]
    """Entities the follow-up needs that its request does not name."""

    @classmethod
    def of(cls, task: Task) -> Conversation | None:
        """The conversation a task's payload records (None for a single ticket)."""
        data = task.payload.get("conversation")
        if data is None:
            return None
        return cls(str(data["first"]), tuple(str(e) for e in data["remembered"]))

    def as_payload(self) -> dict[str, Any]:
        """The `conversation` entry of the follow-up's payload."""
        return {"first": self.first, "remembered": list(self.remembered)}


def customer(task: Task) -> str:
    """The customer's phone, as the ticket header gives it (the subject of their memory)."""
    found = re.search(r"phone (\S+)", task.instruction)
    if found is None:
        raise ValueError(f"task {task.task_id} names no phone in its header")
    return found.group(1)


def follow_up_ticket(first: Ticket, rng: random.Random) -> Ticket:
    """The same customer's next ticket about the same order (see `CHAINS`)."""
    issue = CHAINS[first.issue]
    order_id = first.require_order()
    courier = first.courier or "SF"
    now = first.now + rng.randrange(2, 6) * DAY
    if issue is IssueType.LOST_PARCEL:
        days = first.days_late + rng.randrange(3, 8)
        return dataclasses.replace(first, issue=issue, parcel_lost=True, days_late=days, now=now)
    return dataclasses.replace(
        first,
        issue=issue,
        status=OrderStatus.SHIPPED,
        address=first.new_address,
        new_address=None,
        waybill=waybill_number(courier, order_id, 0),
        days_late=rng.randrange(2, 12),
        now=now,
    )


def follow_up_header(ticket: Ticket, first: Ticket) -> str:
    """The header of a follow-up: category, item and phone, and the waybill only if the first turn had
    none to give (the customer learned it since)."""
    parts = [f"[ticket: {CATEGORIES[ticket.issue]}, follow-up]", f"item {ticket.sku} ({ticket.product})"]
    parts.append(f"phone {ticket.phone}")
    if first.waybill is None and ticket.waybill is not None:
        parts.append(f"waybill {ticket.waybill}")
    return " · ".join(parts)


def conversations(seed: int, split: Split, size: int) -> tuple[tuple[Task, Task], ...]:
    """`size` two-turn conversations of `split`, the same for the same seed, chains alternating; ids
    `orders-<split>-c<index>-1` and `-2`."""
    rng = random.Random(f"orders:{seed}:{split.value}:conversations")
    chains = list(CHAINS)
    out = []
    for index in range(size):
        first = draw_ticket(chains[index % len(chains)], rng)
        second = follow_up_ticket(first, rng)
        base = f"orders-{split.value}-c{index:04d}"
        opening = Task(f"{base}-1", split, instruction(first, rng), first.to_payload())
        words = rng.choice(WORDS[second.issue]).format(**second.to_payload())
        request = f"{words}\n{follow_up_header(second, first)}"
        remembered = tuple(e for e in (second.order_id, second.waybill) if e and e not in request)
        payload = {
            **second.to_payload(),
            "conversation": Conversation(opening.task_id, remembered).as_payload(),
        }
        out.append((opening, Task(f"{base}-2", split, request, payload)))
    return tuple(out)


__all__ = ["CHAINS", "Conversation", "conversations", "customer", "follow_up_header", "follow_up_ticket"]
