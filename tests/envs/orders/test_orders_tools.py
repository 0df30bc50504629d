"""Every orders tool on a hand-made ticket: its effect, its masks and risk flags, and each error it raises."""

from __future__ import annotations

import dataclasses

import pytest

from sessionrl.envs.orders.ticket import IssueType, OrderStatus, Ticket, waybill_number
from sessionrl.envs.orders.tools import (
    DUPLICATE_REFUND,
    REFUND_BEFORE_RETURN,
    TOOLS,
    UNCONFIRMED_RESHIPMENT,
    World,
    erp_sync,
    express_contact,
    inventory_check,
    order_update_address,
    refund_trigger,
    return_check,
    sms_send,
    waybill_generate,
)
from sessionrl.skills import SkillError

NOW = 1_741_000_000
TICKET = Ticket(
    issue=IssueType.DAMAGED_ITEM,
    customer="Li Wei",
    phone="13800001234",
    sku="SKU-48213",
    product="ceramic mug",
    unit_price=39.9,
    package_size="M",
    on_hand=12,
    restock_days=None,
    now=NOW,
    order_id="O-104233",
    quantity=3,
    status=OrderStatus.DELIVERED,
    address="1 Nanjing Road, Shanghai 200001",
    courier="SF",
    waybill="SF1042330000",
    placed_at=NOW - 10 * 86_400,
    return_received=True,
    damaged=2,
    verification_code="482913",
)


def world(**changes: object) -> World:
    return World.open(dataclasses.replace(TICKET, **changes))  # type: ignore[arg-type]


def fails(code: str, w: World, tool: str, **params: object) -> None:
    """The call fails with `code` and leaves the world as it was."""
    before = w.state_hash()
    with pytest.raises(SkillError) as caught:
        TOOLS[tool](w, **params)
    assert caught.value.code == code
    assert w.state_hash() == before


def test_every_contract_has_a_tool() -> None:
    assert sorted(TOOLS) == [
        "erp_sync",
        "express_contact",
        "inventory_check",
        "order_update_address",
        "refund_trigger",
        "return_check",
        "sms_send",
        "waybill_generate",
    ]


def test_inventory_check_reports_stock_and_unlocks_refunds() -> None:
    w = world()
    assert not w.mask()["refund_trigger"]
    answer = inventory_check(w, "SKU-48213")
    assert answer == {
        "sku": "SKU-48213",
        "name": "ceramic mug",
        "on_hand": 12,
        "reserved_for": [],
        "package_size": "M",
        "restock_date": None,
    }
    assert w.mask()["refund_trigger"]


def test_inventory_check_lists_an_unshipped_order_and_a_restock_date() -> None:
    w = world(status=OrderStatus.PAID, on_hand=0, restock_days=5)
    answer = inventory_check(w, "SKU-48213")
    assert answer["reserved_for"] == ["O-104233"]
    assert answer["restock_date"] == "2025-03-08"  # NOW is 2025-03-03 (UTC) plus 5 days


def test_inventory_check_unknown_sku() -> None:
    fails("SKU_NOT_FOUND", world(), "inventory_check", sku="SKU-00000")


def test_return_check_confirms_a_received_return() -> None:
    w = world()
    answer = return_check(w, "O-104233")
    assert answer["return_received"] is True
    assert answer["courier"] == "SF"
    assert w.return_confirmed


def test_return_check_of_goods_not_back_confirms_nothing() -> None:
    w = world(return_received=False)
    assert return_check(w, "O-104233")["received_at"] is None
    assert not w.return_confirmed
    fails("ORDER_NOT_FOUND", w, "return_check", order_id="O-999999")


def test_verify_code_text_returns_the_code_and_unlocks_the_address_change() -> None:
    w = world(status=OrderStatus.PAID)
    assert not w.mask()["order_update_address"]
    answer = sms_send(w, "verify_code", "13800001234", {"order_id": "O-104233"})
    assert answer == {"message_id": "SM-0001", "status": "delivered", "user_reply": "482913"}
    assert w.mask()["order_update_address"]


def test_sms_to_another_phone_or_without_variables_fails() -> None:
    w = world()
    fails("UNKNOWN_RECIPIENT", w, "sms_send", template_id="verify_code", phone="13900000000", variables={})
    fails("MISSING_VARIABLE", w, "sms_send", template_id="refund_notice", phone=TICKET.phone, variables={})


def test_address_change_for_a_verified_customer() -> None:
    w = world(status=OrderStatus.PAID)
    sms_send(w, "verify_code", TICKET.phone, {"order_id": "O-104233"})
    answer = order_update_address(w, "O-104233", "88 Huaihai Road, Shanghai 200001", "482913")
    assert answer == {"order_id": "O-104233", "address": "88 Huaihai Road, Shanghai 200001", "status": "paid"}
    assert w.address == "88 Huaihai Road, Shanghai 200001"


def test_address_change_errors() -> None:
    w = world(status=OrderStatus.PAID)
    change = {"order_id": "O-104233", "new_address": "88 Huaihai Road", "verification_code": "482913"}
    fails("NOT_VERIFIED", w, "order_update_address", **change)
    sms_send(w, "verify_code", TICKET.phone, {"order_id": "O-104233"})
    fails("INVALID_CODE", w, "order_update_address", **{**change, "verification_code": "111111"})
    fails("ORDER_NOT_FOUND", w, "order_update_address", **{**change, "order_id": "O-999999"})
    shipped = world(status=OrderStatus.SHIPPED)
    sms_send(shipped, "verify_code", TICKET.phone, {"order_id": "O-104233"})
    fails("ALREADY_SHIPPED", shipped, "order_update_address", **change)


def test_refund_after_inventory_check_and_confirmed_return_is_clean() -> None:
    w = world()
    inventory_check(w, "SKU-48213")
    return_check(w, "O-104233")
    answer = refund_trigger(w, "O-104233", 79.8, "quality")
    assert answer == {
        "refund_id": "RF-0001",
        "order_id": "O-104233",
        "amount": 79.8,
        "reason": "quality",
        "state": "approved",
    }
    assert w.risk_flags == []


def test_refund_needs_an_inventory_check() -> None:
    fails(
        "PRECONDITION_FAILED", world(), "refund_trigger", order_id="O-104233", amount=10.0, reason="quality"
    )


def test_refund_may_not_exceed_what_is_left() -> None:
    w = world()
    inventory_check(w, "SKU-48213")
    return_check(w, "O-104233")
    # order amount 39.9 * 3 = 119.70; after 100.00 refunded, 19.70 is left
    refund_trigger(w, "O-104233", 100.0, "quality")
    fails("AMOUNT_EXCEEDS_ORDER", w, "refund_trigger", order_id="O-104233", amount=19.71, reason="quality")
    assert refund_trigger(w, "O-104233", 19.704, "quality")["amount"] == 19.7  # rounded to cents first
    assert w.refunded() == 119.7


def test_refund_of_returned_goods_before_the_return_is_confirmed_is_flagged() -> None:
    w = world()
    inventory_check(w, "SKU-48213")
    refund_trigger(w, "O-104233", 10.0, "wrong_item")
    assert w.risk_flags == [REFUND_BEFORE_RETURN]


def test_compensation_needs_no_return_but_a_second_refund_is_flagged() -> None:
    w = world(issue=IssueType.LATE_DELIVERY, status=OrderStatus.SHIPPED)
    inventory_check(w, "SKU-48213")
    refund_trigger(w, "O-104233", 11.97, "late_delivery")
    assert w.risk_flags == []
    refund_trigger(w, "O-104233", 1.0, "late_delivery")
    assert w.risk_flags == [DUPLICATE_REFUND]


def test_trace_confirms_a_lost_parcel() -> None:
    w = world(status=OrderStatus.SHIPPED, parcel_lost=True, days_late=6)
    answer = express_contact(w, "SF1042330000", "trace")
    assert answer == {
        "waybill": "SF1042330000",
        "courier": "SF",
        "status": "lost",
        "package_size": "M",
        "days_late": 6,
    }
    assert w.lost_confirmed


def test_expedite_a_parcel_in_transit() -> None:
    w = world(status=OrderStatus.SHIPPED, days_late=3)
    assert express_contact(w, "SF1042330000", "expedite")["expedited"] is True
    assert w.expedited


def test_express_errors() -> None:
    fails("NOT_EXPEDITABLE", world(), "express_contact", waybill="SF1042330000", request_type="expedite")
    fails("WAYBILL_NOT_FOUND", world(), "express_contact", waybill="JD1042330000", request_type="trace")
    unshipped = world(status=OrderStatus.PAID, waybill=None)
    fails("WAYBILL_NOT_FOUND", unshipped, "express_contact", waybill="SF1042330000", request_type="trace")


def test_waybill_after_a_confirmed_loss_is_a_reshipment() -> None:
    w = world(status=OrderStatus.SHIPPED, parcel_lost=True)
    express_contact(w, "SF1042330000", "trace")
    answer = waybill_generate(w, "O-104233", "SF", "L")
    assert answer == {
        "waybill": waybill_number("SF", "O-104233", 1),
        "order_id": "O-104233",
        "courier": "SF",
        "size": "L",
        "created_at": NOW,
    }
    assert w.waybills[0]["kind"] == "reshipment"
    assert w.risk_flags == []


def test_waybill_after_a_confirmed_return_is_an_exchange() -> None:
    w = world(issue=IssueType.WRONG_ITEM)
    return_check(w, "O-104233")
    waybill_generate(w, "O-104233", "SF", "M")
    assert w.waybills[0]["kind"] == "exchange"


def test_unconfirmed_reshipment_is_flagged_and_small_packages_fail() -> None:
    w = world()
    fails("PACKAGE_TOO_SMALL", w, "waybill_generate", order_id="O-104233", courier="SF", size="S")
    waybill_generate(w, "O-104233", "JD", "XL")
    assert w.risk_flags == [UNCONFIRMED_RESHIPMENT]


def test_erp_books_documents_of_one_type() -> None:
    w = world()
    assert not w.mask()["erp_sync"]
    inventory_check(w, "SKU-48213")
    return_check(w, "O-104233")
    refund_trigger(w, "O-104233", 79.8, "quality")
    assert w.mask()["erp_sync"]
    answer = erp_sync(w, "refund", NOW)
    assert answer == {"sync_id": "ERP-0001", "document_type": "refund", "documents": 1}
    fails("NOTHING_TO_SYNC", w, "erp_sync", document_type="reshipment", timestamp=NOW)


def test_erp_timestamp_must_lie_in_the_order_life() -> None:
    w = world()
    inventory_check(w, "SKU-48213")
    refund_trigger(w, "O-104233", 5.0, "late_delivery")
    fails("INVALID_TIMESTAMP", w, "erp_sync", document_type="refund", timestamp=NOW + 1)
    fails("INVALID_TIMESTAMP", w, "erp_sync", document_type="refund", timestamp=TICKET.placed_at - 1)  # type: ignore[operator]
    erp_sync(w, "refund", TICKET.placed_at)  # type: ignore[arg-type]


def test_state_hash_follows_changes_not_reads() -> None:
    a, b = world(), world()
    assert a.state_hash() == b.state_hash()
    return_check(a, "O-104233")  # confirms the return: a change of what is known
    assert a.state_hash() != b.state_hash()
    return_check(b, "O-104233")
    assert a.state_hash() == b.state_hash()
