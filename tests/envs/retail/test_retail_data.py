"""The retail databases: loaded once, copied per episode on first write, hashed canonically."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionrl.envs import Split
from sessionrl.envs.retail import RetailEnv
from sessionrl.envs.taubench import TauData, TauDb


@pytest.fixture(scope="module")
def data(retail_data: Path) -> TauData:
    return RetailEnv.load_data(retail_data)


def test_loads_every_table_and_task_file(data: TauData) -> None:
    assert {name: len(table) for name, table in data.tables.items()} == {
        "users": 500,
        "orders": 1000,
        "products": 50,
    }
    assert len(data.tool_schemas) == 16
    assert [len(data.raw_tasks(split)) for split in Split] == [500, 20, 115]


def test_edits_are_private_to_one_copy(data: TauData) -> None:
    order_id = next(iter(data.tables["orders"]))
    status = data.tables["orders"][order_id]["status"]
    mine, other = TauDb(data), TauDb(data)
    mine.edit("orders", order_id)["status"] = "cancelled"
    assert mine.get("orders", order_id)["status"] == "cancelled"  # type: ignore[index]
    assert other.get("orders", order_id)["status"] == status  # type: ignore[index]
    assert data.tables["orders"][order_id]["status"] == status
    assert dict(mine.items("orders"))[order_id]["status"] == "cancelled"


def test_the_hash_sees_content_not_history(data: TauData) -> None:
    fresh = TauDb(data).state_hash()
    db = TauDb(data)
    user_id = next(iter(data.tables["users"]))
    assert db.state_hash() == fresh
    address = db.edit("users", user_id)["address"]
    original_city = address["city"]
    address["city"] = "Elsewhere"
    assert db.state_hash() != fresh
    address["city"] = original_city  # edited back: same content, same hash
    assert db.state_hash() == fresh
    reordered = db.edit("users", user_id)
    reordered["address"] = dict(reversed(list(reordered["address"].items())))  # key order is not content
    assert db.state_hash() == fresh
