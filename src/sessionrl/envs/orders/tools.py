"""The eight fulfilment tools as plain functions over one episode's `World`.

A tool returns a JSON object, or raises `SkillError` with a code its contract declares and changes
nothing. Preconditions are the tools' own (a refund needs a successful inventory check, an address change a
verified customer, an ERP booking a document to book); `World.mask` reports them so a policy can avoid
calls that are bound to fail. Calls that succeed but are risky in their order (a refund for returned goods
before the return was confirmed) leave a flag in `World.risk_flags`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from sessionrl.envs.base import ErrorKind
from sessionrl.envs.orders.ticket import (
    SIZES,
    TEMPLATE_VARIABLES,
    OrderStatus,
    Ticket,
    cents,
    date_of,
    waybill_number,
)
from sessionrl.skills import SkillError

Json = dict[str, Any]

RETURN_REASONS: Final = frozenset({"quality", "wrong_item"})
"""Refund reasons that send goods back: refunding them before the return is confirmed is risky."""

REFUND_BEFORE_RETURN: Final = "refund_before_return"
DUPLICATE_REFUND: Final = "duplicate_refund"
UNCONFIRMED_RESHIPMENT: Final = "unconfirmed_reshipment"
RISK_FLAGS: Final = (REFUND_BEFORE_RETURN, DUPLICATE_REFUND, UNCONFIRMED_RESHIPMENT)


@dataclass
class World:
    """The mutable state of one episode: the ticket's order as the tools leave it, and what is confirmed.

    `calls` lists every successful tool call in order as `(tool, params, output)`.
    """

    ticket: Ticket
    status: OrderStatus | None
    address: str | None
    code_sent: bool = False
    inventory_checked: bool = False
    return_confirmed: bool = False
    lost_confirmed: bool = False
    expedited: bool = False
    refunds: list[Json] = field(default_factory=list)
    waybills: list[Json] = field(default_factory=list)
    bookings: list[Json] = field(default_factory=list)
    texts: list[Json] = field(default_factory=list)
    risk_flags: list[str] = field(default_factory=list)
    calls: list[tuple[str, Json, Json]] = field(default_factory=list)

    @classmethod
    def open(cls, ticket: Ticket) -> World:
        """The world as the ticket finds it, before any call."""
        return cls(ticket=ticket, status=ticket.status, address=ticket.address)

    def state_hash(self) -> str:
        """SHA-256 of everything the tools changed (the call log excluded)."""
        state = {
            "status": self.status,
            "address": self.address,
            "confirmed": [
                self.code_sent,
                self.inventory_checked,
                self.return_confirmed,
                self.lost_confirmed,
                self.expedited,
            ],
            "refunds": self.refunds,
            "waybills": self.waybills,
            "bookings": self.bookings,
            "texts": self.texts,
            "risk_flags": self.risk_flags,
        }
        return hashlib.sha256(orjson.dumps(state, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def mask(self) -> dict[str, bool]:
        """Which tools may succeed now, by name: the state-dependent preconditions only."""
        return {
            "inventory_check": True,
            "return_check": True,
            "sms_send": True,
            "order_update_address": self.code_sent,
            "refund_trigger": self.inventory_checked,
            "express_contact": True,
            "waybill_generate": True,
            "erp_sync": bool(self.refunds or self.waybills),
        }

    def refunded(self) -> float:
        """The total refunded so far."""
        return round(sum(float(refund["amount"]) for refund in self.refunds), 2)

    def flag(self, risk: str) -> None:
        """Record a risky call."""
        self.risk_flags.append(risk)

    def order(self, order_id: str) -> Ticket:
        """The ticket, when `order_id` is its order; else `ORDER_NOT_FOUND`."""
        if self.ticket.order_id is None or order_id != self.ticket.order_id:
            raise SkillError("ORDER_NOT_FOUND", f"no order {order_id}")
        return self.ticket


def inventory_check(world: World, sku: str) -> Json:
    """Stock of the ticket's product; confirms the item for a later refund."""
    ticket = world.ticket
    if sku != ticket.sku:
        raise SkillError("SKU_NOT_FOUND", f"no product {sku}")
    world.inventory_checked = True
    waiting = ticket.order_id is not None and world.status is OrderStatus.PAID
    return {
        "sku": sku,
        "name": ticket.product,
        "on_hand": ticket.on_hand,
        "reserved_for": [ticket.order_id] if waiting else [],
        "package_size": ticket.package_size,
        "restock_date": ticket.restock_date(),
    }


def return_check(world: World, order_id: str) -> Json:
    """Whether the order's goods came back; a yes confirms the return."""
    ticket = world.order(order_id)
    world.return_confirmed = world.return_confirmed or ticket.return_received
    return {
        "order_id": order_id,
        "return_received": ticket.return_received,
        "received_at": date_of(ticket.now - 86_400) if ticket.return_received else None,
        "courier": ticket.courier,
    }


def sms_send(world: World, template_id: str, phone: str, variables: Mapping[str, str]) -> Json:
    """Text the customer; a `verify_code` text makes them verified and returns the code they read back."""
    ticket = world.ticket
    if phone != ticket.phone:
        raise SkillError("UNKNOWN_RECIPIENT", f"{phone} is not the phone on file for this ticket")
    missing = [name for name in TEMPLATE_VARIABLES[template_id] if name not in variables]
    if missing:
        raise SkillError("MISSING_VARIABLE", f"template {template_id} needs {', '.join(missing)}")
    reply = None
    if template_id == "verify_code":
        world.code_sent = True
        reply = ticket.verification_code
    world.texts.append({"template_id": template_id, "variables": dict(variables)})
    return {"message_id": f"SM-{len(world.texts):04d}", "status": "delivered", "user_reply": reply}


def order_update_address(world: World, order_id: str, new_address: str, verification_code: str) -> Json:
    """Redirect an unshipped order for a verified customer."""
    ticket = world.order(order_id)
    if not world.code_sent:
        raise SkillError("NOT_VERIFIED", "send the customer a verify_code text first")
    if verification_code != ticket.verification_code:
        raise SkillError("INVALID_CODE", "the code does not match the one the customer received")
    if world.status is not OrderStatus.PAID:
        raise SkillError("ALREADY_SHIPPED", f"order {order_id} is {world.status}; its address is final")
    world.address = new_address
    return {"order_id": order_id, "address": new_address, "status": str(world.status)}


def refund_trigger(world: World, order_id: str, amount: float, reason: str) -> Json:
    """Refund up to what is left of the order amount, once the item was checked in inventory.

    Amounts are money: they are rounded to cents first.
    """
    ticket = world.order(order_id)
    amount = round(amount, 2)
    if not world.inventory_checked:
        raise SkillError("PRECONDITION_FAILED", f"check {ticket.sku} in inventory before refunding")
    left = round(ticket.amount - world.refunded(), 2)
    if amount > left:
        raise SkillError("AMOUNT_EXCEEDS_ORDER", f"only {cents(left)} of order {order_id} is left to refund")
    if reason in RETURN_REASONS and not world.return_confirmed:
        world.flag(REFUND_BEFORE_RETURN)
    if world.refunds:
        world.flag(DUPLICATE_REFUND)
    refund = {"refund_id": f"RF-{len(world.refunds) + 1:04d}", "order_id": order_id, "amount": amount}
    world.refunds.append({**refund, "reason": reason})
    return {**refund, "reason": reason, "state": "approved"}


def express_contact(world: World, waybill: str, request_type: str) -> Json:
    """Trace a parcel (a lost one is confirmed lost) or expedite one still in transit."""
    ticket = world.ticket
    if ticket.waybill is None or waybill != ticket.waybill or ticket.courier is None:
        raise SkillError("WAYBILL_NOT_FOUND", f"no parcel {waybill}")
    in_transit = world.status is OrderStatus.SHIPPED
    status = "lost" if ticket.parcel_lost else ("in_transit" if in_transit else "delivered")
    answer: Json = {
        "waybill": waybill,
        "courier": ticket.courier,
        "status": status,
        "package_size": ticket.package_size,
    }
    if request_type == "trace":
        world.lost_confirmed = world.lost_confirmed or ticket.parcel_lost
        return {**answer, "days_late": ticket.days_late}
    if status != "in_transit":
        raise SkillError("NOT_EXPEDITABLE", f"parcel {waybill} is {status}")
    world.expedited = True
    return {**answer, "expedited": True}


def waybill_generate(world: World, order_id: str, courier: str, size: str) -> Json:
    """Book a new shipment of the order's item; risky unless a loss or a return was confirmed.

    The shipment is an exchange when it follows a confirmed return, else a reshipment.
    """
    ticket = world.order(order_id)
    if SIZES.index(size) < SIZES.index(ticket.package_size):
        raise SkillError("PACKAGE_TOO_SMALL", f"{ticket.product} needs at least size {ticket.package_size}")
    if not (world.lost_confirmed or world.return_confirmed):
        world.flag(UNCONFIRMED_RESHIPMENT)
    waybill = waybill_number(courier, order_id, len(world.waybills) + 1)
    document = {"waybill": waybill, "order_id": order_id, "courier": courier, "size": size}
    kind = "exchange" if world.return_confirmed and not world.lost_confirmed else "reshipment"
    world.waybills.append({**document, "kind": kind})
    return {**document, "created_at": ticket.now}


def _documents(world: World, document_type: str) -> list[Json]:
    """The documents an ERP booking of `document_type` covers; new shipments carry their kind."""
    if document_type == "refund":
        return world.refunds
    return [waybill for waybill in world.waybills if waybill["kind"] == document_type]


def erp_sync(world: World, document_type: str, timestamp: int) -> Json:
    """Book this conversation's documents of one type, at a business time within the order's life."""
    ticket = world.ticket
    documents = _documents(world, document_type)
    if not documents:
        raise SkillError("NOTHING_TO_SYNC", f"no {document_type} was made in this conversation")
    if timestamp > ticket.now or (ticket.placed_at is not None and timestamp < ticket.placed_at):
        raise SkillError("INVALID_TIMESTAMP", f"{timestamp} is before the order or in the future")
    world.bookings.append(
        {"document_type": document_type, "timestamp": timestamp, "documents": len(documents)}
    )
    return {
        "sync_id": f"ERP-{len(world.bookings):04d}",
        "document_type": document_type,
        "documents": len(documents),
    }


TOOLS: Final[dict[str, Callable[..., Json]]] = {
    tool.__name__: tool
    for tool in (
        erp_sync,
        express_contact,
        inventory_check,
        order_update_address,
        refund_trigger,
        return_check,
        sms_send,
        waybill_generate,
    )
}
"""Every tool by its contract name."""

ERROR_KINDS: Final[Mapping[str, ErrorKind]] = {
    "PRECONDITION_FAILED": ErrorKind.PRECONDITION,  # a refund before the item's stock check
    "NOT_VERIFIED": ErrorKind.PRECONDITION,  # an address change before the verify_code text
    "NOTHING_TO_SYNC": ErrorKind.PRECONDITION,  # an ERP booking before the document it books
    "AMOUNT_EXCEEDS_ORDER": ErrorKind.PARAMETER,
    "PACKAGE_TOO_SMALL": ErrorKind.PARAMETER,
    "INVALID_TIMESTAMP": ErrorKind.PARAMETER,
    "MISSING_VARIABLE": ErrorKind.PARAMETER,
}
"""What the tools' own error codes say about the call (`OrdersEnv.error_kinds`)."""
