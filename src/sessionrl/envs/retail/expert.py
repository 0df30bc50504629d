"""The scripted retail expert: a task's gold actions, wrapped in the look-ups a careful agent makes first.

The plan authenticates the user from what the instruction says (an email, or a name and zip code), reads
the user's profile, each order the task touches and each product whose items change, then makes the gold
calls that change the database, and ends with a message that states every expected output.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sessionrl.envs.base import ExpertPlan, Task
from sessionrl.envs.retail.tools import (
    READ_ONLY_TOOLS,
    TOOLS,
    find_user_id_by_email,
    find_user_id_by_name_zip,
)
from sessionrl.envs.taubench import PlanBuilder, TauDb, final_message
from sessionrl.skills import SkillError

Products = Sequence[Sequence[str]]
"""Per action, the ids of the products whose items it changes."""

_LOOKUPS: Final = READ_ONLY_TOOLS - {"transfer_to_human_agents"}
_ITEM_TOOLS: Final = frozenset({"modify_pending_order_items", "exchange_delivered_order_items"})

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_NAME = re.compile(r"(?:[Yy]our? name is|You are|You're|called) ([A-Z][\w'-]*) ([A-Z][\w'-]*)")
_USER_ID_NAME = re.compile(r"\b([a-z]+)_([a-z]+)_\d+\b")
_ZIP = re.compile(r"(?<![\w'])(\d{5})(?![\w'])")  # a bare five-digit number, not a quoted field value


@dataclass(frozen=True, slots=True)
class UserLookup:
    """How the expert finds the user: a look-up tool, its parameters and the id it returns."""

    tool: str
    params: Mapping[str, str]
    user_id: str


def _candidates(instruction: str) -> Iterator[tuple[str, dict[str, str]]]:
    """Look-ups the instruction supports: each email first (the policy's default), then name and zip."""
    for email in _EMAIL.findall(instruction):
        yield "find_user_id_by_email", {"email": email.rstrip(".")}
    zips = _ZIP.findall(instruction)
    names = [m.groups() for m in _NAME.finditer(instruction)] + [
        (first.title(), last.title()) for first, last in _USER_ID_NAME.findall(instruction)
    ]
    for first, last in names:
        for zip_code in zips:
            yield "find_user_id_by_name_zip", {"first_name": first, "last_name": last, "zip": zip_code}


def identify_user(instruction: str, db: TauDb) -> UserLookup | None:
    """The first look-up read from the instruction that finds a user, or None when none does."""
    for tool, params in _candidates(instruction):
        try:
            if tool == "find_user_id_by_email":
                found = find_user_id_by_email(db, **params)
            else:
                found = find_user_id_by_name_zip(db, **params)
        except SkillError:
            continue
        return UserLookup(tool, params, found["user_id"])
    return None


def _fallback_lookup(db: TauDb, user_id: str) -> UserLookup:
    """A look-up by the email on file for the task's user, for instructions naming no findable user."""
    user = db.get("users", user_id)
    if user is None:
        raise ValueError(f"task user {user_id!r} is not in the users database")
    return UserLookup("find_user_id_by_email", {"email": user["email"]}, user_id)


_WORDING: Final = {
    "cancel_pending_order": ("cancel order {order_id}", "cancelled order {order_id}"),
    "modify_pending_order_address": (
        "change the shipping address of order {order_id}",
        "updated the shipping address of order {order_id}",
    ),
    "modify_pending_order_payment": (
        "change the payment method of order {order_id}",
        "changed the payment method of order {order_id}",
    ),
    "modify_pending_order_items": (
        "change the items of order {order_id}",
        "changed the items of order {order_id}",
    ),
    "exchange_delivered_order_items": (
        "request an exchange for order {order_id}",
        "requested an exchange for order {order_id}",
    ),
    "return_delivered_order_items": (
        "request a return for order {order_id}",
        "requested a return for order {order_id}",
    ),
    "modify_user_address": ("change the user's default address", "updated your default address"),
    "transfer_to_human_agents": ("hand the user over to a human agent", "transferred you to a human agent"),
}
"""For each tool that acts: the sub-goal's wording and the wording of the report to the user."""


def _wording(action: Mapping[str, Any], done: bool) -> str:
    return _WORDING[action["name"]][1 if done else 0].format_map(action["kwargs"])


def _touched_products(db: TauDb, action: Mapping[str, Any]) -> list[str]:
    """Products whose items an item-changing action swaps (read from the order as stored)."""
    order = db.get("orders", action["kwargs"].get("order_id", ""))
    if action["name"] not in _ITEM_TOOLS or order is None:
        return []
    wanted = set(action["kwargs"].get("item_ids", []))
    return list(dict.fromkeys(item["product_id"] for item in order["items"] if item["item_id"] in wanted))


def _add_reads(
    plan: PlanBuilder, actions: Sequence[Mapping[str, Any]], touched: Products, profile: str
) -> None:
    """Read each order the actions touch, then the products whose items they change."""
    for action, products in zip(actions, touched, strict=True):
        order_id = action["kwargs"].get("order_id")
        order_step = profile
        if order_id is not None:
            order_step = plan.read(
                order_id,
                f"check the status of order {order_id}",
                "get_order_details",
                {"order_id": order_id},
                [profile],
            )
        for product_id in products:
            description = f"check the available variants of product {product_id}"
            plan.read(
                product_id, description, "get_product_details", {"product_id": product_id}, [order_step]
            )


def _add_actions(
    plan: PlanBuilder, actions: Sequence[Mapping[str, Any]], touched: Products, profile: str
) -> tuple[list[str], list[str]]:
    """Add each action after the reads it needs and the previous action on the same order; the plan runs
    it on its scratch copy to learn what it will report. Returns the reports of successes and failures."""
    done: list[str] = []
    failed: list[str] = []
    last_on: dict[str, str] = {}
    for action, products in zip(actions, touched, strict=True):
        target = action["kwargs"].get("order_id", "user")
        deps = [profile, plan.reads.get(target, profile), last_on.get(target, profile)]
        deps += [plan.reads[p] for p in products]
        step, error = plan.act(action, _wording(action, done=False), deps)
        if error is not None:
            # a later action on the same order must not wait on one the expert knows will fail
            failed.append(f"I could not {_wording(action, done=False)} ({error.message})")
            continue
        last_on[target] = step
        done.append(_wording(action, done=True))
    return done, failed


def expert_plan(task: Task, db: TauDb) -> ExpertPlan:
    """A plan solving `task` when replayed on a fresh copy of the data; `db` is such a copy, used up here."""
    actions = [a for a in task.payload["actions"] if a["name"] not in _LOOKUPS]
    lookup = identify_user(task.instruction, db) or _fallback_lookup(db, task.payload["user_id"])
    plan = PlanBuilder(db, TOOLS)
    found = plan.add("authenticate the user", lookup.tool, lookup.params)
    profile = plan.add(
        "read the user's profile and payment methods",
        "get_user_details",
        {"user_id": lookup.user_id},
        [found],
    )
    touched = [_touched_products(db, action) for action in actions]
    _add_reads(plan, actions, touched, profile)
    done, failed = _add_actions(plan, actions, touched, profile)
    return plan.plan(
        f"resolve the requests of user {lookup.user_id}", final_message(done, failed, task.payload["outputs"])
    )
