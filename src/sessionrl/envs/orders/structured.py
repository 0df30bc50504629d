"""What a structured (non-text) policy sees of an orders episode and how its choices become calls.

A structured policy picks a skill and values for the skill's bounded parameters (numbers with a range,
enums); everything else a call needs (order id, SKU, phone, the address the customer typed, the code they
read back, template variables) is filled here from the ticket header and the tools' answers so far, the
way a form-filling front end would. `summary` writes the reply from what the episode actually did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sessionrl.envs.orders.ticket import COURIERS, SIZES, TEMPLATE_VARIABLES, IssueType, cents, waybill_number
from sessionrl.envs.orders.tools import World

Json = dict[str, Any]
NO_ORDER: Final = "O-000000"
"""Order id sent when the ticket names none (the tools answer ORDER_NOT_FOUND)."""

FEATURES: Final = (
    *(f"issue:{issue.value}" for issue in IssueType),
    "damaged_share",
    *(f"courier:{courier}" for courier in COURIERS),
    *(f"size:{size}" for size in SIZES),
    "code_sent",
    "inventory_checked",
    "return_confirmed",
    "lost_confirmed",
    "expedited",
    "refunded",
    "shipped_again",
    "booked",
    "customer_notified",
)
"""Names of the features, in order. Issue, damaged share and courier come from the ticket the customer
filed; the package size is known once an inventory check answered; the rest say what has been done."""

_ISSUES: Final = tuple(IssueType)
"""The issue types in `FEATURES` order, listed once (iterating an enum is slow, and features run per step)."""


def features(world: World) -> tuple[float, ...]:
    """The episode's features in `FEATURES` order, each in [0, 1]."""
    ticket = world.ticket
    courier = ticket.courier if ticket.waybill is not None else None
    size = ticket.package_size if world.inventory_checked else None
    share = ticket.damaged / ticket.quantity if ticket.quantity else 0.0
    notified = any(text["template_id"] != "verify_code" for text in world.texts)
    flags = (
        world.code_sent,
        world.inventory_checked,
        world.return_confirmed,
        world.lost_confirmed,
        world.expedited,
        bool(world.refunds),
        bool(world.waybills),
        bool(world.bookings),
        notified,
    )
    return (
        *(float(ticket.issue is issue) for issue in _ISSUES),
        share,
        *(float(courier == c) for c in COURIERS),
        *(float(size == s) for s in SIZES),
        *(float(flag) for flag in flags),
    )


def bounds(world: World) -> dict[str, dict[str, tuple[float, float]]]:
    """Episode ranges of numeric parameters, by skill: what is left to refund, the order's lifetime."""
    ticket = world.ticket
    left = max(0.01, round(ticket.amount - world.refunded(), 2))
    placed = ticket.placed_at if ticket.placed_at is not None else ticket.now
    return {
        "refund_trigger": {"amount": (0.01, left)},
        "erp_sync": {"timestamp": (float(placed), float(ticket.now))},
    }


def _variables(world: World, template: str) -> dict[str, str]:
    ticket = world.ticket
    known = {
        "order_id": ticket.order_id or NO_ORDER,
        "amount": cents(world.refunds[-1]["amount"]) if world.refunds else cents(0.0),
        "waybill": world.waybills[-1]["waybill"] if world.waybills else ticket.waybill or "",
    }
    return {name: known[name] for name in TEMPLATE_VARIABLES[template]}


def bind(world: World, skill: str, chosen: Mapping[str, Any]) -> Json:
    """Complete a call to `skill` from the policy's `chosen` bounded parameters and the episode's context."""
    ticket = world.ticket
    order_id = ticket.order_id or NO_ORDER
    if skill == "inventory_check":
        return {"sku": ticket.sku}
    if skill == "return_check":
        return {"order_id": order_id}
    if skill == "sms_send":
        template = chosen["template_id"]
        return {"template_id": template, "phone": ticket.phone, "variables": _variables(world, template)}
    if skill == "order_update_address":
        address = ticket.new_address or ticket.address or "unknown address"
        code = ticket.verification_code if world.code_sent and ticket.verification_code else "000000"
        return {"order_id": order_id, "new_address": address, "verification_code": code}
    if skill == "refund_trigger":
        return {"order_id": order_id, "amount": round(chosen["amount"], 2), "reason": chosen["reason"]}
    if skill == "express_contact":
        waybill = ticket.waybill or waybill_number(COURIERS[0], NO_ORDER, 0)
        return {"waybill": waybill, "request_type": chosen["request_type"]}
    if skill == "waybill_generate":
        return {"order_id": order_id, "courier": chosen["courier"], "size": chosen["size"]}
    if skill == "erp_sync":
        return {"document_type": chosen["document_type"], "timestamp": int(chosen["timestamp"])}
    raise KeyError(f"no orders skill named {skill!r}")


def summary(world: World) -> str:
    """A reply stating what the episode did and learned, one sentence per fact."""
    ticket = world.ticket
    lines = []
    if world.address != ticket.address:
        lines.append(f"Order {ticket.order_id} will now be delivered to {world.address}.")
    lines += [f"We refunded {cents(r['amount'])} yuan for order {r['order_id']}." for r in world.refunds]
    lines += [f"Order {w['order_id']} ships again with waybill {w['waybill']}." for w in world.waybills]
    if world.expedited:
        lines.append(f"The courier is expediting waybill {ticket.waybill}.")
    if world.inventory_checked:
        stock = f"{ticket.on_hand} units on hand" if ticket.on_hand else f"back on {ticket.restock_date()}"
        lines.append(f"{ticket.product} ({ticket.sku}): {stock}.")
    return " ".join(lines) or "We have received your request."
