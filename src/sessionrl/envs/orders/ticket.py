"""What one fulfilment ticket is about: the issue, the customer, the item, the order, and the hidden truth.

A `Ticket` is the typed view of a task's payload. Some of its fields are visible to the policy through
the ticket header and the tools (order number, SKU, phone, waybill); others are the ground truth that only
the tools reveal or the judge uses (whether the parcel is lost, the code the customer will read back).
Values derived from the policy (refund amounts, new waybill numbers) are functions here, so the expert
and the judge compute them the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final


class IssueType(StrEnum):
    """The problem a customer brings; each has one correct resolution pattern (see `expert.pattern`)."""

    WRONG_ADDRESS = "wrong_address"
    DAMAGED_ITEM = "damaged_item"
    LATE_DELIVERY = "late_delivery"
    LOST_PARCEL = "lost_parcel"
    WRONG_ITEM = "wrong_item"
    STOCK_INQUIRY = "stock_inquiry"


class OrderStatus(StrEnum):
    """Where an order is in fulfilment."""

    PAID = "paid"
    """Paid and waiting in the warehouse; its address may still change."""
    SHIPPED = "shipped"
    DELIVERED = "delivered"


COURIERS: Final = ("SF", "JD", "YT", "ZT")
SIZES: Final = ("S", "M", "L", "XL")
REFUND_REASONS: Final = ("quality", "wrong_item", "late_delivery")
TEMPLATE_VARIABLES: Final[Mapping[str, tuple[str, ...]]] = {
    "verify_code": ("order_id",),
    "refund_notice": ("order_id", "amount"),
    "delay_apology": ("order_id", "amount"),
    "reship_notice": ("order_id", "waybill"),
    "exchange_notice": ("order_id", "waybill"),
}
"""Each SMS template and the variables it needs."""

LATE_COMPENSATION: Final = 0.10
"""Share of the order amount refunded as compensation for a late delivery."""


def cents(amount: float) -> str:
    """An amount as text with two decimals, the way tools and messages write money.

    >>> cents(23.4)
    '23.40'
    """
    return f"{amount:.2f}"


def date_of(timestamp: int) -> str:
    """The UTC calendar date of a Unix timestamp.

    >>> date_of(1740787200)
    '2025-03-01'
    """
    return datetime.fromtimestamp(timestamp, UTC).date().isoformat()


@dataclass(frozen=True, slots=True)
class Ticket:
    """One customer ticket and the world behind it. Built from (and written to) a task payload.

    Order fields are None for a stock inquiry, which names no order. `waybill` is None until the order
    has shipped.
    """

    issue: IssueType
    customer: str
    phone: str
    sku: str
    product: str
    unit_price: float
    package_size: str
    on_hand: int
    restock_days: int | None
    now: int
    order_id: str | None = None
    quantity: int = 0
    status: OrderStatus | None = None
    address: str | None = None
    courier: str | None = None
    waybill: str | None = None
    placed_at: int | None = None
    return_received: bool = False
    parcel_lost: bool = False
    days_late: int = 0
    damaged: int = 0
    new_address: str | None = None
    verification_code: str | None = None

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Ticket:
        """The ticket a task payload describes (see `to_payload`); a follow-up's `conversation` entry is
        about the task, not the ticket, and is left out."""
        data = {key: value for key, value in payload.items() if key != "conversation"}
        data["issue"] = IssueType(data["issue"])
        if data.get("status") is not None:
            data["status"] = OrderStatus(data["status"])
        return cls(**data)

    def to_payload(self) -> dict[str, Any]:
        """The ticket as plain JSON values, for `Task.payload`."""
        return {key: str(value) if isinstance(value, StrEnum) else value for key, value in _items(self)}

    @property
    def amount(self) -> float:
        """What the order cost (unit price times quantity), 0 without an order."""
        return round(self.unit_price * self.quantity, 2)

    def require_order(self) -> str:
        """The order id; raises ValueError for a ticket without an order."""
        if self.order_id is None:
            raise ValueError(f"a {self.issue} ticket names no order")
        return self.order_id

    def refund_amount(self) -> float:
        """The refund the policy grants: damaged units at their price, or the late-delivery compensation."""
        if self.issue is IssueType.DAMAGED_ITEM:
            return round(self.unit_price * self.damaged, 2)
        if self.issue is IssueType.LATE_DELIVERY:
            return round(self.amount * LATE_COMPENSATION, 2)
        raise ValueError(f"a {self.issue} ticket earns no refund")

    def new_waybill(self, number: int) -> str:
        """The waybill the `number`-th (1-based) new shipment of this order gets with its own courier."""
        return waybill_number(self.courier or COURIERS[0], self.require_order(), number)

    def restock_date(self) -> str | None:
        """The date the item is back in stock, for an item that is out of stock."""
        if self.restock_days is None:
            return None
        return (datetime.fromtimestamp(self.now, UTC) + timedelta(days=self.restock_days)).date().isoformat()


def waybill_number(courier: str, order_id: str, number: int) -> str:
    """A waybill number: courier prefix, the order's six digits, then the shipment's four-digit number.

    Shipment 0 is the original parcel.

    >>> waybill_number("SF", "O-104233", 1)
    'SF1042330001'
    """
    return f"{courier}{order_id.removeprefix('O-')}{number:04d}"


def _items(ticket: Ticket) -> list[tuple[str, Any]]:
    return [(item.name, getattr(ticket, item.name)) for item in dataclasses.fields(ticket)]
