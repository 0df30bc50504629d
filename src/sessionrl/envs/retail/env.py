"""The τ-bench retail domain: its tables, its 16 tools, its expert and the examples of its contracts.

Everything else (the data folder, contracts from `tools.json`, episodes, the success rule, gold replay)
comes from the τ-bench base, `sessionrl.envs.taubench`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Final

from sessionrl.envs.base import ExpertPlan, Task
from sessionrl.envs.retail.expert import expert_plan
from sessionrl.envs.retail.tools import ERROR_MEANINGS, TOOLS
from sessionrl.envs.taubench import Json, TauEnv

DATA_ENV_VAR: Final = "SESSIONRL_RETAIL_DATA"
"""The environment variable naming the retail data folder when none is given."""


class RetailEnv(TauEnv):
    """The retail domain over one data folder (`data`, else `$SESSIONRL_RETAIL_DATA`)."""

    name = "retail"
    tables = ("users", "orders", "products")
    tools = tuple(TOOLS.values())
    errors: ClassVar[Mapping[str, str]] = ERROR_MEANINGS
    data_variable = DATA_ENV_VAR
    data_source = (
        "convert the data files of the public benchmark (sierra-research/tau-bench, MIT licence) or use a "
        "copy you already have."
    )

    def expert(self, task: Task) -> ExpertPlan:
        """Authenticate, read what the task touches, make the gold changes, state the expected outputs."""
        return expert_plan(task, self.fresh_db())

    def examples(self) -> dict[str, list[Json]]:
        """Calls built from the data (the first user, order and product) for the tools whose examples would
        not come from the tasks; the tools that change orders take the first gold action calling them, the
        shared tools (`calculate`, `think`, ...) their own examples."""
        user_id, user = next(iter(self.data.tables["users"].items()))
        return {
            "find_user_id_by_email": [{"email": user["email"]}],
            "find_user_id_by_name_zip": [{**user["name"], "zip": user["address"]["zip"]}],
            "get_order_details": [{"order_id": next(iter(self.data.tables["orders"]))}],
            "get_product_details": [{"product_id": next(iter(self.data.tables["products"]))}],
            "get_user_details": [{"user_id": user_id}],
            "list_all_product_types": [{}],
            "modify_user_address": [{"user_id": user_id, **user["address"]}],
        }
