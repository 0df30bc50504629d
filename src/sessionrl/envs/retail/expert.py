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

from sessionrl.envs.base import ExpertPlan, ExpertStep, Task
from sessionrl.envs.retail.data import RetailDb
from sessionrl.envs.retail.tools import READ_ONLY_TOOLS, find_user_id_by_email, find_user_id_by_name_zip
from sessionrl.skills import SkillError

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


def identify_user(instruction: str, db: RetailDb) -> UserLookup | None:
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


def _fallback_lookup(db: RetailDb, user_id: str) -> UserLookup:
    """A look-up by the email on file for the task's user, for instructions naming no findable user."""
    user = db.get("users", user_id)
    if user is None:
        raise ValueError(f"task user {user_id!r} is not in the users database")
    return UserLookup("find_user_id_by_email", {"email": user["email"]}, user_id)


class _PlanBuilder:
    """Appends numbered steps and remembers which step read each order and product."""

    def __init__(self) -> None:
        self.steps: list[ExpertStep] = []
        self.order_step: dict[str, str] = {}
        self.product_step: dict[str, str] = {}

    def add(self, description: str, tool: str, params: Mapping[str, Any], depends_on: Sequence[str]) -> str:
        step_id = f"s{len(self.steps) + 1}"
        deps = tuple(dict.fromkeys(depends_on))
        self.steps.append(ExpertStep(step_id, description, tool, dict(params), deps))
        return step_id


def _touched_products(db: RetailDb, action: Mapping[str, Any]) -> list[str]:
    """Products whose items an item-changing action swaps (read from the order as stored)."""
    order = db.get("orders", action["kwargs"].get("order_id", ""))
    if action["name"] not in _ITEM_TOOLS or order is None:
        return []
    wanted = set(action["kwargs"].get("item_ids", []))
    return list(dict.fromkeys(item["product_id"] for item in order["items"] if item["item_id"] in wanted))


def _describe(action: Mapping[str, Any]) -> str:
    kwargs = action["kwargs"]
    target = kwargs.get("order_id") or kwargs.get("user_id") or "the user"
    return f"{action['name'].replace('_', ' ')} for {target}"


def expert_plan(task: Task, db: RetailDb) -> ExpertPlan:
    """A plan solving `task` when replayed on a fresh copy of the data that `db` shows."""
    actions = [a for a in task.payload["actions"] if a["name"] not in _LOOKUPS]
    lookup = identify_user(task.instruction, db) or _fallback_lookup(db, task.payload["user_id"])
    user_id = lookup.user_id
    plan = _PlanBuilder()
    found = plan.add("authenticate the user", lookup.tool, lookup.params, [])
    profile = plan.add(
        "read the user's profile and payment methods", "get_user_details", {"user_id": user_id}, [found]
    )
    for action in actions:
        order_id = action["kwargs"].get("order_id")
        if order_id is not None and order_id not in plan.order_step:
            plan.order_step[order_id] = plan.add(
                f"check order {order_id}", "get_order_details", {"order_id": order_id}, [profile]
            )
        for product_id in _touched_products(db, action):
            if product_id not in plan.product_step:
                plan.product_step[product_id] = plan.add(
                    f"check the variants of product {product_id}",
                    "get_product_details",
                    {"product_id": product_id},
                    [plan.order_step[order_id]] if order_id is not None else [profile],
                )
    last_on: dict[str, str] = {}
    for action in actions:
        target = action["kwargs"].get("order_id") or user_id
        deps = [profile, plan.order_step.get(target, profile), last_on.get(target, profile)]
        deps += [plan.product_step[p] for p in _touched_products(db, action)]
        last_on[target] = plan.add(_describe(action), action["name"], action["kwargs"], deps)
    return ExpertPlan(
        goal=f"resolve the requests of user {user_id}",
        steps=tuple(plan.steps),
        final_message=_final_message(actions, task.payload["outputs"]),
    )


def _final_message(actions: Sequence[Mapping[str, Any]], outputs: Sequence[str]) -> str:
    done = "; ".join(_describe(a) for a in actions) or "no change was needed"
    facts = f" The details you asked for: {'; '.join(outputs)}." if outputs else ""
    return f"All done: {done}.{facts} Is there anything else I can help with?"
