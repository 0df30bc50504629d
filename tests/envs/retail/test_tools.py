"""Every retail tool on the τ-bench data: its effect, and each failure it reports without a change."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionrl.envs.retail import RetailEnv
from sessionrl.envs.retail.tools import (
    INSUFFICIENT_BALANCE,
    INVALID_ARGUMENT,
    INVALID_STATE,
    NOT_FOUND,
    TOOLS,
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
)
from sessionrl.envs.taubench import Record, TauData, TauDb
from sessionrl.envs.taubench.shared import calculate, think, transfer_to_human_agents
from sessionrl.skills import SkillError

ADDRESS = {
    "address1": "1 Test Way",
    "address2": "Unit 2",
    "city": "Austin",
    "state": "TX",
    "country": "USA",
    "zip": "73301",
}


@pytest.fixture(scope="module")
def data(retail_data: Path) -> TauData:
    return RetailEnv.load_data(retail_data)


@pytest.fixture
def db(data: TauData) -> TauDb:
    return TauDb(data)


def orders(data: TauData, status: str) -> Iterator[Record]:
    return (order for order in data.tables["orders"].values() if order["status"] == status)


def methods(data: TauData, order: Record) -> dict[str, Record]:
    result: dict[str, Record] = data.tables["users"][order["user_id"]]["payment_methods"]
    return result


def other_variant(data: TauData, item: Record, available: bool = True) -> Record | None:
    variants = data.tables["products"][item["product_id"]]["variants"]
    return next(
        (v for v in variants.values() if v["item_id"] != item["item_id"] and v["available"] is available),
        None,
    )


def assert_fails(db: TauDb, code: str, tool: Callable[..., Any], **kwargs: Any) -> SkillError:
    """The call fails with `code`, is not retryable in kind (a domain code), and changes nothing."""
    before = db.state_hash()
    with pytest.raises(SkillError) as caught:
        tool(db, **kwargs)
    assert caught.value.code == code
    assert db.state_hash() == before
    return caught.value


def test_all_sixteen_tools_match_the_schemas(data: TauData) -> None:
    assert sorted(TOOLS) == sorted(schema["function"]["name"] for schema in data.tool_schemas)
    assert len(TOOLS) == 16


# look-ups


def test_find_user_by_email_ignores_case(db: TauDb, data: TauData) -> None:
    user_id, user = next(iter(data.tables["users"].items()))
    assert find_user_id_by_email(db, user["email"].upper()) == {"user_id": user_id}
    assert_fails(db, NOT_FOUND, find_user_id_by_email, email="nobody@example.com")


def test_find_user_by_name_and_zip(db: TauDb, data: TauData) -> None:
    user_id, user = next(iter(data.tables["users"].items()))
    first, last, zip_code = user["name"]["first_name"], user["name"]["last_name"], user["address"]["zip"]
    assert find_user_id_by_name_zip(db, first.lower(), last.upper(), zip_code) == {"user_id": user_id}
    assert_fails(db, NOT_FOUND, find_user_id_by_name_zip, first_name=first, last_name=last, zip="00000")


@pytest.mark.parametrize(
    ("tool", "table", "param"),
    [
        (get_user_details, "users", "user_id"),
        (get_order_details, "orders", "order_id"),
        (get_product_details, "products", "product_id"),
    ],
)
def test_get_details_returns_a_copy_or_not_found(
    db: TauDb, data: TauData, tool: Callable[..., Any], table: str, param: str
) -> None:
    key, record = next(iter(data.tables[table].items()))
    before = db.state_hash()
    got = tool(db, **{param: key})
    assert got == record
    got.clear()  # changing the answer must not change the episode's state
    assert db.state_hash() == before
    assert_fails(db, NOT_FOUND, tool, **{param: "no-such-key"})


def test_list_all_product_types_is_sorted_by_name(db: TauDb, data: TauData) -> None:
    listing = list_all_product_types(db)
    assert len(listing) == len(data.tables["products"]) == 50
    assert list(listing) == sorted(listing)
    for name, product_id in listing.items():
        assert data.tables["products"][product_id]["name"] == name


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("2 + 2", 4),
        ("(1.5 + 2.25) * 2 / 3", 2.5),
        ("10 / 3", 3.33),
        ("-4 + 1", -3),
        ("0.1 + 0.2", 0.3),
    ],
)
def test_calculate_rounds_to_cents(db: TauDb, expression: str, result: float) -> None:
    assert calculate(db, expression) == {"result": result}


@pytest.mark.parametrize("expression", ["2 ^ 2", "__import__('os')", "2 +", "1 / 0", "2 ** 3", "", "()"])
def test_calculate_refuses_anything_but_arithmetic(db: TauDb, expression: str) -> None:
    assert_fails(db, INVALID_ARGUMENT, calculate, expression=expression)


def test_think_and_transfer_change_nothing(db: TauDb) -> None:
    before = db.state_hash()
    assert think(db, "the user wants a refund") == {}
    assert transfer_to_human_agents(db, "wants to speak to a person") == {"transferred": True}
    assert db.state_hash() == before


# cancel


def test_cancel_refunds_every_payment_and_credits_gift_cards(db: TauDb, data: TauData) -> None:
    order = next(
        o
        for o in orders(data, "pending")
        if o["payment_history"][0]["payment_method_id"].startswith("gift_card")
    )
    card_id = order["payment_history"][0]["payment_method_id"]
    balance = methods(data, order)[card_id]["balance"]
    amount = order["payment_history"][0]["amount"]
    result = cancel_pending_order(db, order["order_id"], "no longer needed")
    assert result["status"] == "cancelled"
    assert result["cancel_reason"] == "no longer needed"
    assert result["payment_history"][-1] == {
        "transaction_type": "refund",
        "amount": amount,
        "payment_method_id": card_id,
    }
    user = get_user_details(db, order["user_id"])
    assert user["payment_methods"][card_id]["balance"] == round(balance + amount, 2)
    assert data.tables["orders"][order["order_id"]]["status"] == "pending"  # the original is untouched


def test_cancel_errors(db: TauDb, data: TauData) -> None:
    pending = next(orders(data, "pending"))["order_id"]
    delivered = next(orders(data, "delivered"))["order_id"]
    assert_fails(db, NOT_FOUND, cancel_pending_order, order_id="#W0000000", reason="no longer needed")
    assert_fails(db, INVALID_STATE, cancel_pending_order, order_id=delivered, reason="no longer needed")
    assert_fails(db, INVALID_ARGUMENT, cancel_pending_order, order_id=pending, reason="changed my mind")


# modify pending order


def test_modify_order_address(db: TauDb, data: TauData) -> None:
    pending = next(orders(data, "pending"))["order_id"]
    assert modify_pending_order_address(db, pending, **ADDRESS)["address"] == ADDRESS
    processed = next(orders(data, "processed"))["order_id"]
    assert_fails(db, NOT_FOUND, modify_pending_order_address, order_id="#W0000000", **ADDRESS)
    assert_fails(db, INVALID_STATE, modify_pending_order_address, order_id=processed, **ADDRESS)


def _payment_case(data: TauData) -> tuple[Record, str, float]:
    """A pending order paid by a non-gift method whose user has a gift card covering the amount."""
    for order in orders(data, "pending"):
        amount = order["payment_history"][0]["amount"]
        for method in methods(data, order).values():
            paid_by_card = order["payment_history"][0]["payment_method_id"].startswith("gift_card")
            if method["source"] == "gift_card" and method["balance"] >= amount and not paid_by_card:
                return order, method["id"], method["balance"]
    raise AssertionError("the data holds no such order")


def test_modify_payment_charges_new_and_refunds_old(db: TauDb, data: TauData) -> None:
    order, card_id, balance = _payment_case(data)
    old = order["payment_history"][0]
    result = modify_pending_order_payment(db, order["order_id"], card_id)
    assert result["payment_history"][1:] == [
        {"transaction_type": "payment", "amount": old["amount"], "payment_method_id": card_id},
        {
            "transaction_type": "refund",
            "amount": old["amount"],
            "payment_method_id": old["payment_method_id"],
        },
    ]
    card = get_user_details(db, order["user_id"])["payment_methods"][card_id]
    assert card["balance"] == round(balance - old["amount"], 2)
    assert result["status"] == "pending"
    # a second change now meets three payment entries
    assert_fails(
        db, INVALID_STATE, modify_pending_order_payment, order_id=order["order_id"], payment_method_id=card_id
    )


def test_modify_payment_errors(db: TauDb, data: TauData) -> None:
    order = next(orders(data, "pending"))
    current = order["payment_history"][0]["payment_method_id"]
    delivered = next(orders(data, "delivered"))
    poor = next(
        (o, m["id"])
        for o in orders(data, "pending")
        for m in methods(data, o).values()
        if m["source"] == "gift_card"
        and m["balance"] < o["payment_history"][0]["amount"]
        and m["id"] != o["payment_history"][0]["payment_method_id"]
    )
    tool = modify_pending_order_payment
    assert_fails(db, NOT_FOUND, tool, order_id="#W0000000", payment_method_id=current)
    assert_fails(db, INVALID_STATE, tool, order_id=delivered["order_id"], payment_method_id=current)
    assert_fails(db, NOT_FOUND, tool, order_id=order["order_id"], payment_method_id="paypal_0000000")
    assert_fails(db, INVALID_ARGUMENT, tool, order_id=order["order_id"], payment_method_id=current)
    assert_fails(db, INSUFFICIENT_BALANCE, tool, order_id=poor[0]["order_id"], payment_method_id=poor[1])


def _swap_case(data: TauData, status: str) -> tuple[Record, Record, Record, str]:
    """An order in `status`, one of its items, another available variant, and a non-gift method."""
    for order in orders(data, status):
        item = order["items"][0]
        variant = other_variant(data, item)
        paying = [m["id"] for m in methods(data, order).values() if m["source"] != "gift_card"]
        if variant is not None and paying:
            return order, item, variant, paying[0]
    raise AssertionError("the data holds no such order")


def test_modify_items_swaps_variants_and_settles_the_difference(db: TauDb, data: TauData) -> None:
    order, item, variant, method = _swap_case(data, "pending")
    result = modify_pending_order_items(
        db, order["order_id"], [item["item_id"]], [variant["item_id"]], method
    )
    assert result["status"] == "pending (item modified)"
    swapped = result["items"][0]
    assert (swapped["item_id"], swapped["price"], swapped["options"]) == (
        variant["item_id"],
        variant["price"],
        variant["options"],
    )
    difference = round(variant["price"] - item["price"], 2)
    assert result["payment_history"][-1] == {
        "transaction_type": "payment" if difference > 0 else "refund",
        "amount": abs(difference),
        "payment_method_id": method,
    }
    # modify can only happen once: the order is no longer plain pending
    assert_fails(
        db,
        INVALID_STATE,
        modify_pending_order_items,
        order_id=order["order_id"],
        item_ids=[variant["item_id"]],
        new_item_ids=[item["item_id"]],
        payment_method_id=method,
    )


def _unavailable_case(data: TauData, status: str) -> tuple[Record, Record, str]:
    """An order in `status`, one of its items, and an unavailable variant of the same product."""
    for order in orders(data, status):
        for item in order["items"]:
            variant = other_variant(data, item, available=False)
            if variant is not None:
                return order, item, variant["item_id"]
    raise AssertionError("the data holds no such order")


SWAP_TOOLS = ["modify_pending_order_items", "exchange_delivered_order_items"]
SWAP_STATUS = {"modify_pending_order_items": "pending", "exchange_delivered_order_items": "delivered"}


@pytest.mark.parametrize("tool_name", SWAP_TOOLS)
def test_item_swap_errors(db: TauDb, data: TauData, tool_name: str) -> None:
    tool, status = TOOLS[tool_name], SWAP_STATUS[tool_name]
    order, item, variant, method = _swap_case(data, status)
    old, new = item["item_id"], variant["item_id"]
    held = sum(i["item_id"] == old for i in order["items"])
    foreign = next(p for p in data.tables["products"].values() if p["product_id"] != item["product_id"])
    call = {"order_id": order["order_id"], "payment_method_id": method}
    assert_fails(db, NOT_FOUND, tool, **{**call, "order_id": "#W0000000"}, item_ids=[old], new_item_ids=[new])
    assert_fails(db, NOT_FOUND, tool, **call, item_ids=["0000000000"], new_item_ids=[new])
    assert_fails(db, NOT_FOUND, tool, **call, item_ids=[old] * (held + 1), new_item_ids=[new] * (held + 1))
    assert_fails(db, INVALID_ARGUMENT, tool, **call, item_ids=[old], new_item_ids=[new, new])
    assert_fails(db, INVALID_ARGUMENT, tool, **call, item_ids=[], new_item_ids=[])
    assert_fails(
        db, INVALID_ARGUMENT, tool, **call, item_ids=[old], new_item_ids=[next(iter(foreign["variants"]))]
    )
    no_method = {**call, "payment_method_id": "gift_card_0000000"}
    assert_fails(db, NOT_FOUND, tool, **no_method, item_ids=[old], new_item_ids=[new])
    sold_out_order, sold_out_item, sold_out = _unavailable_case(data, status)
    sold_out_call = {
        "order_id": sold_out_order["order_id"],
        "payment_method_id": next(iter(methods(data, sold_out_order))),
    }
    assert_fails(
        db,
        INVALID_ARGUMENT,
        tool,
        **sold_out_call,
        item_ids=[sold_out_item["item_id"]],
        new_item_ids=[sold_out],
    )
    other_status = next(o for o in orders(data, "processed"))
    same = [other_status["items"][0]["item_id"]]
    assert_fails(
        db,
        INVALID_STATE,
        tool,
        **{**call, "order_id": other_status["order_id"]},
        item_ids=same,
        new_item_ids=same,
    )


@pytest.mark.parametrize("tool_name", SWAP_TOOLS)
def test_item_swap_needs_gift_card_cover(db: TauDb, data: TauData, tool_name: str) -> None:
    status = SWAP_STATUS[tool_name]
    for order in orders(data, status):
        cards = [m for m in methods(data, order).values() if m["source"] == "gift_card"]
        for item in order["items"]:
            variants = data.tables["products"][item["product_id"]]["variants"].values()
            dearer = [v for v in variants if v["available"] and v["price"] - item["price"] > 0]
            for card in cards:
                over = [v for v in dearer if v["price"] - item["price"] > card["balance"]]
                if over:
                    kwargs = {"order_id": order["order_id"], "item_ids": [item["item_id"]]}
                    kwargs |= {"new_item_ids": [over[0]["item_id"]], "payment_method_id": card["id"]}
                    assert_fails(db, INSUFFICIENT_BALANCE, TOOLS[tool_name], **kwargs)
                    return
    raise AssertionError("the data holds no such order")


# delivered orders


def test_exchange_records_the_request_and_charges_nothing_yet(db: TauDb, data: TauData) -> None:
    order, item, variant, method = _swap_case(data, "delivered")
    result = exchange_delivered_order_items(
        db, order["order_id"], [item["item_id"]], [variant["item_id"]], method
    )
    assert result["status"] == "exchange requested"
    assert result["exchange_items"] == [item["item_id"]]
    assert result["exchange_new_items"] == [variant["item_id"]]
    assert result["exchange_payment_method_id"] == method
    assert result["exchange_price_difference"] == round(variant["price"] - item["price"], 2)
    assert result["payment_history"] == order["payment_history"]
    assert result["items"] == order["items"]


def test_return_records_sorted_items_and_refund_method(db: TauDb, data: TauData) -> None:
    order = next(o for o in orders(data, "delivered") if len(o["items"]) >= 2)
    original = order["payment_history"][0]["payment_method_id"]
    item_ids = [order["items"][1]["item_id"], order["items"][0]["item_id"]]
    result = return_delivered_order_items(db, order["order_id"], item_ids, original)
    assert result["status"] == "return requested"
    assert result["return_items"] == sorted(item_ids)
    assert result["return_payment_method_id"] == original


def test_return_errors(db: TauDb, data: TauData) -> None:
    tool = return_delivered_order_items
    order = next(
        o
        for o in orders(data, "delivered")
        if any(
            m["source"] != "gift_card" and m["id"] != o["payment_history"][0]["payment_method_id"]
            for m in methods(data, o).values()
        )
    )
    original = order["payment_history"][0]["payment_method_id"]
    other = next(
        m["id"] for m in methods(data, order).values() if m["source"] != "gift_card" and m["id"] != original
    )
    item = order["items"][0]["item_id"]
    pending = next(orders(data, "pending"))
    call = {"order_id": order["order_id"], "payment_method_id": original}
    assert_fails(db, NOT_FOUND, tool, **{**call, "order_id": "#W0000000"}, item_ids=[item])
    assert_fails(
        db,
        INVALID_STATE,
        tool,
        order_id=pending["order_id"],
        item_ids=[pending["items"][0]["item_id"]],
        payment_method_id=pending["payment_history"][0]["payment_method_id"],
    )
    assert_fails(db, NOT_FOUND, tool, **{**call, "payment_method_id": "paypal_0000000"}, item_ids=[item])
    assert_fails(db, INVALID_ARGUMENT, tool, **{**call, "payment_method_id": other}, item_ids=[item])
    assert_fails(db, NOT_FOUND, tool, **call, item_ids=["0000000000"])
    assert_fails(db, INVALID_ARGUMENT, tool, **call, item_ids=[])


def test_modify_user_address(db: TauDb, data: TauData) -> None:
    user_id = next(iter(data.tables["users"]))
    assert modify_user_address(db, user_id, **ADDRESS)["address"] == ADDRESS
    assert get_user_details(db, user_id)["address"] == ADDRESS
    assert_fails(db, NOT_FOUND, modify_user_address, user_id="nobody_0", **ADDRESS)
