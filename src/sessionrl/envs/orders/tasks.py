"""Seeded fulfilment tickets: a world drawn per issue type, and the customer's words about it.

Split `s` of seed `k` is drawn from its own random stream (`orders:k:s`), so changing one split's size
never changes another's tasks. Issue types are dealt round-robin and then shuffled, so every split of at
least six tasks holds every type. The instruction is the customer's message (English or Chinese, from
varied templates) followed by the ticket header the shop's form adds: category, order, item, phone and,
once shipped, the waybill.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Final

from sessionrl.envs.base import Split, Task
from sessionrl.envs.orders.ticket import COURIERS, IssueType, OrderStatus, Ticket, waybill_number

START: Final = 1_740_787_200
"""2025-03-01 00:00 UTC: tickets arrive within the 180 days that follow."""
DAY: Final = 86_400

CATALOG: Final = (
    ("bluetooth speaker", 199.0, "M"),
    ("ceramic mug", 39.9, "S"),
    ("down jacket", 599.0, "L"),
    ("desk lamp", 129.0, "M"),
    ("running shoes", 459.0, "M"),
    ("rice cooker", 329.0, "L"),
    ("yoga mat", 89.0, "L"),
    ("phone case", 29.9, "S"),
    ("office chair", 899.0, "XL"),
    ("tea set", 268.0, "M"),
    ("wireless earbuds", 349.0, "S"),
    ("air purifier", 1299.0, "XL"),
    ("backpack", 219.0, "M"),
    ("electric kettle", 149.0, "M"),
    ("wool scarf", 159.0, "S"),
)
"""Products: name, unit price in yuan, package size."""

NAMES: Final = ("Li Wei", "Wang Fang", "Zhang Min", "Chen Jing", "Liu Yang", "Emma Clark", "Noah Fischer")
STREETS: Final = (
    "Nanjing Road",
    "Huaihai Road",
    "Zhongshan Avenue",
    "Jianguo Road",
    "Tianhe Road",
    "Wenyi Road",
)
CITIES: Final = (
    ("Shanghai", "200001"),
    ("Beijing", "100020"),
    ("Guangzhou", "510620"),
    ("Hangzhou", "310012"),
    ("Shenzhen", "518048"),
    ("Chengdu", "610041"),
)

CATEGORIES: Final[Mapping[IssueType, str]] = {issue: issue.value.replace("_", " ") for issue in IssueType}

TEMPLATES: Final[Mapping[IssueType, tuple[str, ...]]] = {
    IssueType.WRONG_ADDRESS: (
        "Hi, I entered the wrong delivery address for my {product}. Please send it to {new_address} instead.",
        "Can you change where order {order_id} goes? The correct address is {new_address}.",
        "I just moved! Please ship my {product} to {new_address}, not to my old place.",
        "我的收货地址填错了，请把订单 {order_id} 改寄到 {new_address}。",
    ),
    IssueType.DAMAGED_ITEM: (
        "{damaged} of the {quantity} {product} I received were broken. I already sent them back; "
        "I'd like my money back for those.",
        "My {product} arrived damaged ({damaged} out of {quantity}). The broken ones are back with you, "
        "please refund them.",
        "Order {order_id}: {damaged} {product} cracked in transit. Returned them last week, refund please.",
        "收到的{product}有{damaged}件损坏（共{quantity}件），已经寄回了，请退款。",
    ),
    IssueType.LATE_DELIVERY: (
        "My {product} should have arrived {days_late} days ago and it's still not here. What's going on?",
        "Order {order_id} is {days_late} days late. Can you hurry it up?",
        "Still waiting for my {product}: it's {days_late} days past the promised date.",
        "订单 {order_id} 已经晚了{days_late}天还没到，请帮忙催一下。",
    ),
    IssueType.LOST_PARCEL: (
        "Tracking for my {product} hasn't moved in {days_late} days. I think the parcel is lost.",
        "Order {order_id} has had no scan for {days_late} days and nothing came. Is it lost?",
        "Where is my package? The {product} seems to have vanished, no updates for {days_late} days.",
        "我的包裹{days_late}天没有物流更新了，{product}是不是丢了？",
    ),
    IssueType.WRONG_ITEM: (
        "I ordered a {product} but got something completely different. I've mailed it back, please send "
        "the right one.",
        "Wrong item in order {order_id}! I returned it already; I still want my {product}.",
        "The box had the wrong product instead of my {product}. It's back with you; please exchange it.",
        "收到的不是我买的{product}，已经退回了，请给我换成正确的商品。",
    ),
    IssueType.STOCK_INQUIRY: (
        "Do you have the {product} ({sku}) in stock? I'd like to buy one.",
        "Is {sku} available right now?",
        "When can I get the {product}? Is it in stock?",
        "请问{product}（{sku}）还有货吗？",
    ),
}
"""The customer's words for each issue type; placeholders are `Ticket` fields."""


def _address(rng: random.Random) -> str:
    city, zip_code = rng.choice(CITIES)
    return f"{rng.randrange(1, 400)} {rng.choice(STREETS)}, {city} {zip_code}"


def _new_address(rng: random.Random, old: str) -> str:
    while True:
        address = _address(rng)
        if address != old:
            return address


_STATUS: Final[Mapping[IssueType, OrderStatus]] = {
    IssueType.WRONG_ADDRESS: OrderStatus.PAID,
    IssueType.DAMAGED_ITEM: OrderStatus.DELIVERED,
    IssueType.LATE_DELIVERY: OrderStatus.SHIPPED,
    IssueType.LOST_PARCEL: OrderStatus.SHIPPED,
    IssueType.WRONG_ITEM: OrderStatus.DELIVERED,
}


def draw_ticket(issue: IssueType, rng: random.Random) -> Ticket:
    """A ticket of type `issue` with every value drawn from `rng`."""
    product, price, size = rng.choice(CATALOG)
    now = START + rng.randrange(180 * DAY)
    on_hand = 0 if issue is IssueType.STOCK_INQUIRY and rng.random() < 0.3 else rng.randrange(1, 80)
    item = Ticket(
        issue=issue,
        customer=rng.choice(NAMES),
        phone=f"1{rng.choice('3456789')}{rng.randrange(10**9):09d}",
        sku=f"SKU-{rng.randrange(10_000, 100_000)}",
        product=product,
        unit_price=price,
        package_size=size,
        on_hand=on_hand,
        restock_days=None if on_hand else rng.randrange(3, 22),
        now=now,
    )
    if issue is IssueType.STOCK_INQUIRY:
        return item
    status = _STATUS[issue]
    order_id = f"O-{rng.randrange(100_000, 1_000_000)}"
    courier = rng.choice(COURIERS)
    quantity = rng.randrange(1, 5) if issue is IssueType.DAMAGED_ITEM else rng.randrange(1, 3)
    address = _address(rng)
    late = issue in (IssueType.LATE_DELIVERY, IssueType.LOST_PARCEL)
    return dataclasses.replace(
        item,
        order_id=order_id,
        quantity=quantity,
        status=status,
        address=address,
        courier=courier,
        waybill=None if status is OrderStatus.PAID else waybill_number(courier, order_id, 0),
        placed_at=now - rng.randrange(3, 25) * DAY,
        return_received=issue in (IssueType.DAMAGED_ITEM, IssueType.WRONG_ITEM),
        parcel_lost=issue is IssueType.LOST_PARCEL,
        days_late=rng.randrange(2, 12) if late else 0,
        damaged=rng.randrange(1, quantity + 1) if issue is IssueType.DAMAGED_ITEM else 0,
        new_address=_new_address(rng, address) if issue is IssueType.WRONG_ADDRESS else None,
        verification_code=f"{rng.randrange(10**6):06d}",
    )


def header(ticket: Ticket) -> str:
    """The ticket header the shop's form appends to the customer's message."""
    parts = [f"[ticket: {CATEGORIES[ticket.issue]}]"]
    if ticket.order_id is not None:
        parts.append(f"order {ticket.order_id}")
    parts += [f"item {ticket.sku} ({ticket.product})", f"phone {ticket.phone}"]
    if ticket.waybill is not None:
        parts.append(f"waybill {ticket.waybill}")
    return " · ".join(parts)


def instruction(ticket: Ticket, rng: random.Random) -> str:
    """The customer's message (a template drawn from `rng`) and the ticket header."""
    words = rng.choice(TEMPLATES[ticket.issue]).format(**ticket.to_payload())
    return f"{words}\n{header(ticket)}"


def generate(seed: int, split: Split, size: int) -> tuple[Task, ...]:
    """`size` tasks of `split`, the same for the same seed; ids are `orders-<split>-<index>`."""
    rng = random.Random(f"orders:{seed}:{split.value}")
    issues = [list(IssueType)[i % len(IssueType)] for i in range(size)]
    rng.shuffle(issues)
    tasks = []
    for index, issue in enumerate(issues):
        ticket = draw_ticket(issue, rng)
        task_id = f"orders-{split.value}-{index:04d}"
        tasks.append(Task(task_id, split, instruction(ticket, rng), ticket.to_payload()))
    return tuple(tasks)
