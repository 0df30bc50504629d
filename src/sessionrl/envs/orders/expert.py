"""The one correct resolution of each issue type, the facts the reply must state, and the expert's plan.

`pattern(ticket)` is the single source of what solving a ticket means: the expert replays it and the judge
matches an episode's calls against it. Steps name their dependencies, so any order that respects them
counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from sessionrl.envs.base import ExpertPlan, ExpertStep
from sessionrl.envs.orders.ticket import IssueType, Ticket, cents

Facts = tuple[tuple[str, ...], ...]
"""Facts a reply must state; each fact is a tuple of equivalent spellings."""

GOALS: Final[Mapping[IssueType, str]] = {
    IssueType.WRONG_ADDRESS: "Redirect the unshipped order to the address the customer gives",
    IssueType.DAMAGED_ITEM: "Refund the damaged units once their return is confirmed",
    IssueType.LATE_DELIVERY: "Expedite the late parcel and compensate the customer",
    IssueType.LOST_PARCEL: "Confirm the loss and ship a replacement",
    IssueType.WRONG_ITEM: "Confirm the return and ship the right item",
    IssueType.STOCK_INQUIRY: "Tell the customer whether the item is in stock",
}


def _step(
    number: int, description: str, tool: str, params: Mapping[str, Any], depends_on: tuple[int, ...] = ()
) -> ExpertStep:
    return ExpertStep(f"s{number}", description, tool, params, tuple(f"s{n}" for n in depends_on))


def _check_stock(number: int, ticket: Ticket) -> ExpertStep:
    return _step(number, f"Check {ticket.sku} in inventory", "inventory_check", {"sku": ticket.sku})


def _text(number: int, ticket: Ticket, template: str, after: tuple[int, ...], **variables: str) -> ExpertStep:
    params = {"template_id": template, "phone": ticket.phone, "variables": variables}
    return _step(number, f"Text the customer ({template})", "sms_send", params, after)


def _wrong_address(t: Ticket) -> tuple[ExpertStep, ...]:
    order_id = t.require_order()
    update = {"order_id": order_id, "new_address": t.new_address, "verification_code": t.verification_code}
    return (
        _check_stock(1, t),
        _text(2, t, "verify_code", (1,), order_id=order_id),
        _step(3, "Change the delivery address", "order_update_address", update, (2,)),
    )


def _refund(t: Ticket, number: int, reason: str, after: tuple[int, ...]) -> ExpertStep:
    params = {"order_id": t.require_order(), "amount": t.refund_amount(), "reason": reason}
    return _step(number, f"Refund {cents(t.refund_amount())} ({reason})", "refund_trigger", params, after)


def _book(number: int, t: Ticket, document_type: str) -> ExpertStep:
    params = {"document_type": document_type, "timestamp": t.now}
    return _step(number, f"Book the {document_type} in the ERP", "erp_sync", params, (3,))


def _damaged_item(t: Ticket) -> tuple[ExpertStep, ...]:
    order_id = t.require_order()
    return (
        _check_stock(1, t),
        _step(2, "Confirm the damaged goods came back", "return_check", {"order_id": order_id}),
        _refund(t, 3, "quality", (1, 2)),
        _book(4, t, "refund"),
        _text(5, t, "refund_notice", (3,), order_id=order_id, amount=cents(t.refund_amount())),
    )


def _late_delivery(t: Ticket) -> tuple[ExpertStep, ...]:
    order_id = t.require_order()
    expedite = {"waybill": t.waybill, "request_type": "expedite"}
    return (
        _step(1, "Ask the courier to expedite the parcel", "express_contact", expedite),
        _check_stock(2, t),
        _refund(t, 3, "late_delivery", (1, 2)),
        _text(4, t, "delay_apology", (3,), order_id=order_id, amount=cents(t.refund_amount())),
    )


def _new_shipment(
    t: Ticket, confirm: ExpertStep, document_type: str, template: str
) -> tuple[ExpertStep, ...]:
    order_id = t.require_order()
    ship = {"order_id": order_id, "courier": t.courier, "size": t.package_size}
    return (
        confirm,
        _check_stock(2, t),
        _step(3, f"Ship the item again ({document_type})", "waybill_generate", ship, (1, 2)),
        _book(4, t, document_type),
        _text(5, t, template, (3,), order_id=order_id, waybill=t.new_waybill(1)),
    )


def _lost_parcel(t: Ticket) -> tuple[ExpertStep, ...]:
    trace = _step(1, "Trace the parcel", "express_contact", {"waybill": t.waybill, "request_type": "trace"})
    return _new_shipment(t, trace, "reshipment", "reship_notice")


def _wrong_item(t: Ticket) -> tuple[ExpertStep, ...]:
    confirm = _step(1, "Confirm the wrong item came back", "return_check", {"order_id": t.require_order()})
    return _new_shipment(t, confirm, "exchange", "exchange_notice")


def _stock_inquiry(t: Ticket) -> tuple[ExpertStep, ...]:
    return (_check_stock(1, t),)


_PATTERNS: Final[Mapping[IssueType, Callable[[Ticket], tuple[ExpertStep, ...]]]] = {
    IssueType.WRONG_ADDRESS: _wrong_address,
    IssueType.DAMAGED_ITEM: _damaged_item,
    IssueType.LATE_DELIVERY: _late_delivery,
    IssueType.LOST_PARCEL: _lost_parcel,
    IssueType.WRONG_ITEM: _wrong_item,
    IssueType.STOCK_INQUIRY: _stock_inquiry,
}


def pattern(ticket: Ticket) -> tuple[ExpertStep, ...]:
    """The calls that resolve `ticket`, with their exact parameters and dependencies."""
    return _PATTERNS[ticket.issue](ticket)


def amount_spellings(amount: float) -> tuple[str, ...]:
    """The ways a reply may state a money amount: with cents, and as the shortest decimal."""
    return tuple(dict.fromkeys((cents(amount), f"{amount:g}")))


def key_facts(ticket: Ticket) -> Facts:
    """What the final reply must state for `ticket` to count as resolved."""
    issue = ticket.issue
    if issue is IssueType.STOCK_INQUIRY:
        stock = str(ticket.on_hand) if ticket.on_hand else ticket.restock_date()
        return ((ticket.sku,), (stock or "",))
    order = (ticket.require_order(),)
    if issue is IssueType.WRONG_ADDRESS:
        return (order, (ticket.new_address or "",))
    if issue in (IssueType.DAMAGED_ITEM, IssueType.LATE_DELIVERY):
        return (order, amount_spellings(ticket.refund_amount()))
    return (order, (ticket.new_waybill(1),))


def final_message(ticket: Ticket) -> str:
    """The expert's reply to the customer, stating every key fact."""
    issue, order_id = ticket.issue, ticket.order_id
    if issue is IssueType.STOCK_INQUIRY:
        if ticket.on_hand:
            return f"{ticket.product} ({ticket.sku}) is in stock: {ticket.on_hand} units on hand."
        back = ticket.restock_date()
        return f"{ticket.product} ({ticket.sku}) is out of stock; it is expected back on {back}."
    if issue is IssueType.WRONG_ADDRESS:
        return f"Done: order {order_id} will now be delivered to {ticket.new_address}."
    if issue is IssueType.DAMAGED_ITEM:
        amount = cents(ticket.refund_amount())
        return f"We refunded {amount} yuan for the damaged {ticket.product} of order {order_id}."
    if issue is IssueType.LATE_DELIVERY:
        amount = cents(ticket.refund_amount())
        return (
            f"Sorry that order {order_id} is late: the courier is expediting it, and we refunded "
            f"{amount} yuan as compensation."
        )
    what = "a replacement" if issue is IssueType.LOST_PARCEL else f"the right {ticket.product}"
    return f"We shipped {what} for order {order_id}; the new waybill is {ticket.new_waybill(1)}."


def expert_plan(ticket: Ticket) -> ExpertPlan:
    """The pattern as a plan, followed by the reply that states the key facts."""
    return ExpertPlan(goal=GOALS[ticket.issue], steps=pattern(ticket), final_message=final_message(ticket))
