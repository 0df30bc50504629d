"""The 16 retail tools as plain functions over one episode's tables (`users`, `orders`, `products`).

Each tool returns a JSON object. A failure raises `SkillError` with one of the codes its `@tool` mark
declares (never retryable: asking again gives the same answer) and changes nothing: every check runs before
the first write. Returned records are copies, so a caller cannot change the episode's state through them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Final

import orjson

from sessionrl.envs.taubench import Json, Record, TauDb, Tool, tool, toolbox
from sessionrl.envs.taubench.shared import (
    INVALID_ARGUMENT,
    SHARED_ERRORS,
    calculate,
    think,
    transfer_to_human_agents,
)
from sessionrl.skills import SkillError

NOT_FOUND: Final = "NOT_FOUND"
INVALID_STATE: Final = "INVALID_STATE"
INSUFFICIENT_BALANCE: Final = "INSUFFICIENT_BALANCE"
ERROR_MEANINGS: Final = {
    **SHARED_ERRORS,
    NOT_FOUND: "A user, order, product, item or payment method does not exist.",
    INVALID_STATE: "The order's status does not allow the action.",
    INSUFFICIENT_BALANCE: "The gift card does not cover the amount.",
}

_SWAP_ERRORS: Final = (NOT_FOUND, INVALID_STATE, INVALID_ARGUMENT, INSUFFICIENT_BALANCE)
CANCEL_REASONS: Final = ("no longer needed", "ordered by mistake")


def _copy(record: Record) -> Json:
    return orjson.loads(orjson.dumps(record))  # type: ignore[no-any-return]


def _address(address1: str, address2: str, city: str, state: str, country: str, zip: str) -> Json:
    """An address record, its keys in the order the data uses."""
    return {
        "address1": address1,
        "address2": address2,
        "city": city,
        "country": country,
        "state": state,
        "zip": zip,
    }


def _found(db: TauDb, table: str, key: str, what: str) -> Record:
    record = db.get(table, key)
    if record is None:
        raise SkillError(NOT_FOUND, f"{what} {key!r} not found")
    return record


def _order_in(db: TauDb, order_id: str, status: str) -> Record:
    order = _found(db, "orders", order_id, "order")
    if order["status"] != status:
        raise SkillError(INVALID_STATE, f"order {order_id} is {order['status']!r}, not {status!r}")
    return order


def _payment_method(db: TauDb, user_id: str, payment_method_id: str) -> Record:
    methods: dict[str, Record] = _found(db, "users", user_id, "user")["payment_methods"]
    if payment_method_id not in methods:
        raise SkillError(NOT_FOUND, f"payment method {payment_method_id!r} not found for user {user_id}")
    return methods[payment_method_id]


def _require_balance(method: Record, amount: float) -> None:
    if method["source"] == "gift_card" and method["balance"] < amount:
        raise SkillError(
            INSUFFICIENT_BALANCE, f"gift card {method['id']} holds {method['balance']}, {amount} is needed"
        )


def _move_balance(db: TauDb, user_id: str, payment_method_id: str, delta: float) -> None:
    """Add `delta` to a gift card's balance (rounded to cents); other methods hold no balance."""
    if db.get("users", user_id) is None:
        return
    method = db.edit("users", user_id)["payment_methods"].get(payment_method_id)
    if method is not None and method["source"] == "gift_card":
        method["balance"] = round(method["balance"] + delta, 2)


def _require_items(order: Record, item_ids: Sequence[str]) -> None:
    held = Counter(item["item_id"] for item in order["items"])
    for item_id, wanted in Counter(item_ids).items():
        if held[item_id] < wanted:
            raise SkillError(
                NOT_FOUND, f"item {item_id} not found {wanted} time(s) in order {order['order_id']}"
            )


def _swap_targets(
    db: TauDb, order: Record, item_ids: Sequence[str], new_item_ids: Sequence[str]
) -> list[tuple[int, Record]]:
    """For each old item, its position in the order and the variant it becomes; raises on any bad pair."""
    if not item_ids:
        raise SkillError(INVALID_ARGUMENT, "no items given")
    if len(item_ids) != len(new_item_ids):
        raise SkillError(INVALID_ARGUMENT, "item_ids and new_item_ids must have the same length")
    _require_items(order, item_ids)
    used: set[int] = set()
    targets: list[tuple[int, Record]] = []
    for old_id, new_id in zip(item_ids, new_item_ids, strict=True):
        index = next(
            i for i, item in enumerate(order["items"]) if item["item_id"] == old_id and i not in used
        )
        used.add(index)
        product = _found(db, "products", order["items"][index]["product_id"], "product")
        variant = product["variants"].get(new_id)
        if variant is None or not variant["available"]:
            raise SkillError(
                INVALID_ARGUMENT, f"new item {new_id} is not an available variant of {product['name']}"
            )
        targets.append((index, variant))
    return targets


def _price_difference(order: Record, targets: Sequence[tuple[int, Record]]) -> float:
    difference: float = sum(variant["price"] - order["items"][i]["price"] for i, variant in targets)
    return round(difference, 2)


@tool(errors=(NOT_FOUND,))
def find_user_id_by_email(db: TauDb, email: str) -> Json:
    """The id of the user with this email (case-insensitive)."""
    wanted = email.strip().lower()
    for user_id, user in db.items("users"):
        if user["email"].lower() == wanted:
            return {"user_id": user_id}
    raise SkillError(NOT_FOUND, f"no user with email {email!r}")


@tool(errors=(NOT_FOUND,))
def find_user_id_by_name_zip(db: TauDb, first_name: str, last_name: str, zip: str) -> Json:
    """The id of the user with this name (case-insensitive) and zip code."""
    first, last = first_name.strip().lower(), last_name.strip().lower()
    for user_id, user in db.items("users"):
        name = user["name"]
        if (name["first_name"].lower(), name["last_name"].lower(), user["address"]["zip"]) == (
            first,
            last,
            zip,
        ):
            return {"user_id": user_id}
    raise SkillError(NOT_FOUND, f"no user named {first_name} {last_name} with zip {zip}")


@tool(errors=(NOT_FOUND,))
def get_user_details(db: TauDb, user_id: str) -> Json:
    """The user's record: name, address, email, payment methods, orders."""
    return _copy(_found(db, "users", user_id, "user"))


@tool(errors=(NOT_FOUND,))
def get_order_details(db: TauDb, order_id: str) -> Json:
    """The order's record: items, fulfilments, status, payment history."""
    return _copy(_found(db, "orders", order_id, "order"))


@tool(errors=(NOT_FOUND,))
def get_product_details(db: TauDb, product_id: str) -> Json:
    """The product's record with every variant."""
    return _copy(_found(db, "products", product_id, "product"))


@tool()
def list_all_product_types(db: TauDb) -> Json:
    """`{product name: product id}` for every product, sorted by name."""
    return dict(sorted((product["name"], product_id) for product_id, product in db.items("products")))


@tool(errors=(NOT_FOUND, INVALID_STATE, INVALID_ARGUMENT), writes=True)
def cancel_pending_order(db: TauDb, order_id: str, reason: str) -> Json:
    """Cancel a pending order and refund every payment (gift cards at once)."""
    order = _order_in(db, order_id, "pending")
    if reason not in CANCEL_REASONS:
        raise SkillError(INVALID_ARGUMENT, f"reason must be one of {CANCEL_REASONS}, got {reason!r}")
    order = db.edit("orders", order_id)
    payments = [p for p in order["payment_history"] if p["transaction_type"] == "payment"]
    for payment in payments:
        refund = {**payment, "transaction_type": "refund"}
        order["payment_history"].append(refund)
        _move_balance(db, order["user_id"], payment["payment_method_id"], payment["amount"])
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    return _copy(order)


@tool(errors=(NOT_FOUND, INVALID_STATE), writes=True)
def modify_pending_order_address(
    db: TauDb, order_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> Json:
    """Replace the shipping address of a pending order."""
    _order_in(db, order_id, "pending")
    order = db.edit("orders", order_id)
    order["address"] = _address(address1, address2, city, state, country, zip)
    return _copy(order)


@tool(errors=_SWAP_ERRORS, writes=True)
def modify_pending_order_payment(db: TauDb, order_id: str, payment_method_id: str) -> Json:
    """Pay a pending order with another method: charge the new one, refund the old one."""
    order = _order_in(db, order_id, "pending")
    method = _payment_method(db, order["user_id"], payment_method_id)
    if len(order["payment_history"]) != 1:
        raise SkillError(INVALID_STATE, f"order {order_id} must have exactly one payment to change it")
    old = order["payment_history"][0]
    if old["payment_method_id"] == payment_method_id:
        raise SkillError(INVALID_ARGUMENT, f"order {order_id} is already paid with {payment_method_id}")
    _require_balance(method, old["amount"])
    order = db.edit("orders", order_id)
    amount, user_id = old["amount"], order["user_id"]
    order["payment_history"].extend(
        [
            {"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id},
            {"transaction_type": "refund", "amount": amount, "payment_method_id": old["payment_method_id"]},
        ]
    )
    _move_balance(db, user_id, payment_method_id, -amount)
    _move_balance(db, user_id, old["payment_method_id"], amount)
    return _copy(order)


@tool(errors=_SWAP_ERRORS, writes=True)
def modify_pending_order_items(
    db: TauDb, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> Json:
    """Swap items of a pending order for other variants of the same products; settle the difference."""
    order = _order_in(db, order_id, "pending")
    targets = _swap_targets(db, order, item_ids, new_item_ids)
    method = _payment_method(db, order["user_id"], payment_method_id)
    difference = _price_difference(order, targets)
    _require_balance(method, difference)
    order = db.edit("orders", order_id)
    if difference != 0:
        kind = "payment" if difference > 0 else "refund"
        entry = {"transaction_type": kind, "amount": abs(difference), "payment_method_id": payment_method_id}
        order["payment_history"].append(entry)
        _move_balance(db, order["user_id"], payment_method_id, -difference)
    for index, variant in targets:
        item = order["items"][index]
        item.update(item_id=variant["item_id"], price=variant["price"], options=_copy(variant["options"]))
    order["status"] = "pending (item modified)"
    return _copy(order)


@tool(errors=_SWAP_ERRORS, writes=True)
def exchange_delivered_order_items(
    db: TauDb, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> Json:
    """Request an exchange of delivered items for other variants; the difference is settled later."""
    order = _order_in(db, order_id, "delivered")
    targets = _swap_targets(db, order, item_ids, new_item_ids)
    method = _payment_method(db, order["user_id"], payment_method_id)
    difference = _price_difference(order, targets)
    _require_balance(method, difference)
    order = db.edit("orders", order_id)
    order.update(
        status="exchange requested",
        exchange_items=sorted(item_ids),
        exchange_new_items=sorted(new_item_ids),
        exchange_payment_method_id=payment_method_id,
        exchange_price_difference=difference,
    )
    return _copy(order)


@tool(errors=(NOT_FOUND, INVALID_STATE, INVALID_ARGUMENT), writes=True)
def return_delivered_order_items(
    db: TauDb, order_id: str, item_ids: list[str], payment_method_id: str
) -> Json:
    """Request a return of delivered items, refunded to the original method or a gift card."""
    order = _order_in(db, order_id, "delivered")
    method = _payment_method(db, order["user_id"], payment_method_id)
    original = order["payment_history"][0]["payment_method_id"]
    if payment_method_id != original and method["source"] != "gift_card":
        raise SkillError(
            INVALID_ARGUMENT, f"refund must go to the original method {original} or a gift card of the user"
        )
    if not item_ids:
        raise SkillError(INVALID_ARGUMENT, "no items given")
    _require_items(order, item_ids)
    order = db.edit("orders", order_id)
    order.update(
        status="return requested", return_items=sorted(item_ids), return_payment_method_id=payment_method_id
    )
    return _copy(order)


@tool(errors=(NOT_FOUND,), writes=True)
def modify_user_address(
    db: TauDb, user_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> Json:
    """Replace a user's default address."""
    _found(db, "users", user_id, "user")
    user = db.edit("users", user_id)
    user["address"] = _address(address1, address2, city, state, country, zip)
    return _copy(user)


TOOLS: Final[dict[str, Tool[...]]] = toolbox(
    [
        calculate,
        cancel_pending_order,
        exchange_delivered_order_items,
        find_user_id_by_email,
        find_user_id_by_name_zip,
        get_order_details,
        get_product_details,
        get_user_details,
        list_all_product_types,
        modify_pending_order_address,
        modify_pending_order_items,
        modify_pending_order_payment,
        modify_user_address,
        return_delivered_order_items,
        think,
        transfer_to_human_agents,
    ]
)
"""Every tool by its name in `tools.json`."""

READ_ONLY_TOOLS: Final = frozenset(name for name, each in TOOLS.items() if not each.writes)
"""Tools that never change the database."""
