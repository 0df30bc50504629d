"""The τ-bench retail domain as a `DecisionEnv`: its policy, 16 skills, 635 tasks, success rule and expert.

Success follows the benchmark: the database after the agent's calls must equal the database after the
task's gold actions (compared by canonical hash), and every expected output string must appear in some
message to the user (case-insensitive, commas removed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sessionrl.envs.base import Episode, ExpertPlan, Outcome, Split, Task
from sessionrl.envs.faults import Faults, with_faults
from sessionrl.envs.retail.data import RetailData, RetailDb
from sessionrl.envs.retail.expert import expert_plan
from sessionrl.envs.retail.tools import ERROR_MEANINGS, READ_ONLY_TOOLS, TOOL_ERRORS, TOOLS, Json
from sessionrl.skills import RiskLevel, Skill, SkillContract, SkillError, callable_skill

TERMINAL_TOOL = "transfer_to_human_agents"


def build_contracts(
    tool_schemas: Sequence[Mapping[str, Any]], examples: Mapping[str, Sequence[Json]]
) -> tuple[SkillContract, ...]:
    """Skill contracts from OpenAI function schemas: unknown parameters refused, domain errors final."""
    contracts = []
    for schema in tool_schemas:
        function = schema["function"]
        name = function["name"]
        contract = {
            "name": name,
            "description": function["description"],
            "input_schema": {**function["parameters"], "additionalProperties": False},
            "errors": {
                code: {"retryable": False, "description": ERROR_MEANINGS[code]} for code in TOOL_ERRORS[name]
            },
            "risk": RiskLevel.LOW if name in READ_ONLY_TOOLS else RiskLevel.HIGH,
            "examples": tuple(examples.get(name, ())),
        }
        contracts.append(SkillContract.model_validate(contract))
    return tuple(sorted(contracts, key=lambda c: c.name))


def contract_examples(data: RetailData, tasks: Sequence[Task]) -> dict[str, list[Json]]:
    """One valid call per tool, from the data: the first user, order and product, and the first gold
    action of `tasks` for each tool that changes the database."""
    user_id, user = next(iter(data.tables["users"].items()))
    name = user["name"]
    examples: dict[str, list[Json]] = {
        "calculate": [{"expression": "(1 + 2) * 3.5"}],
        "find_user_id_by_email": [{"email": user["email"]}],
        "find_user_id_by_name_zip": [{**name, "zip": user["address"]["zip"]}],
        "get_order_details": [{"order_id": next(iter(data.tables["orders"]))}],
        "get_product_details": [{"product_id": next(iter(data.tables["products"]))}],
        "get_user_details": [{"user_id": user_id}],
        "list_all_product_types": [{}],
        "modify_user_address": [{"user_id": user_id, **user["address"]}],
        "think": [{"thought": "the order is pending, so it can still be cancelled"}],
        "transfer_to_human_agents": [{"summary": "the user asks for a person"}],
    }
    for task in tasks:
        for action in task.payload["actions"]:
            examples.setdefault(action["name"], [dict(action["kwargs"])])
    return examples


def apply_actions(db: RetailDb, actions: Sequence[Mapping[str, Any]]) -> int:
    """Run `{name, kwargs}` actions on `db` in order, as the benchmark does; returns how many failed."""
    failed = 0
    for action in actions:
        try:
            TOOLS[action["name"]](db, **action["kwargs"])
        except SkillError:
            failed += 1
    return failed


def _task(split: Split, index: int, raw: Mapping[str, Any]) -> Task:
    payload = {key: raw[key] for key in ("user_id", "actions", "outputs", "annotator") if key in raw}
    return Task(
        task_id=f"retail-{split.value}-{index}", split=split, instruction=raw["instruction"], payload=payload
    )


def _normal(text: str) -> str:
    return text.lower().replace(",", "")


class RetailEnv:
    """The retail domain over one data folder (see `resolve_data_dir`). Loads the data once."""

    name = "retail"

    def __init__(self, data: str | Path | RetailData) -> None:
        self.data = data if isinstance(data, RetailData) else RetailData.load(data)
        self._tasks = {
            split: tuple(_task(split, i, raw) for i, raw in enumerate(self.data.raw_tasks(split)))
            for split in Split
        }
        examples = contract_examples(self.data, self._tasks[Split.TRAIN])
        self._contracts = build_contracts(self.data.tool_schemas, examples)
        self._gold_hashes: dict[str, str] = {}

    def system_prompt(self) -> str:
        """The domain policy (`wiki.md`)."""
        return self.data.wiki

    def contracts(self) -> Sequence[SkillContract]:
        """The 16 tool contracts, sorted by name."""
        return self._contracts

    def tasks(self, split: Split) -> Sequence[Task]:
        """The tasks of `split` in file order (ids `retail-<split>-<index>`)."""
        return self._tasks[split]

    def episode(self, task: Task, *, seed: int = 0, faults: Faults | None = None) -> RetailEpisode:
        """A fresh copy of the databases with skills bound to it."""
        return RetailEpisode(self, task, seed=seed, faults=faults)

    def expert(self, task: Task) -> ExpertPlan:
        """Authenticate, read what the task touches, make the gold changes, state the expected outputs."""
        return expert_plan(task, RetailDb(self.data))

    def gold_hash(self, task: Task) -> str:
        """The state hash after the task's gold actions on a fresh copy (computed once per task)."""
        if task.task_id not in self._gold_hashes:
            db = RetailDb(self.data)
            apply_actions(db, task.payload["actions"])
            self._gold_hashes[task.task_id] = db.state_hash()
        return self._gold_hashes[task.task_id]


class RetailEpisode(Episode):
    """One task over its own copy of the databases."""

    def __init__(self, env: RetailEnv, task: Task, *, seed: int, faults: Faults | None) -> None:
        self._env = env
        self._task = task
        self._db = RetailDb(env.data)
        self._terminated = False
        bound = [callable_skill(contract, self._bind(contract.name)) for contract in env.contracts()]
        self._skills = with_faults(bound, faults, seed)

    def _bind(self, name: str) -> Callable[[Json], Json]:
        tool = TOOLS[name]

        def run(params: Json) -> Json:
            output = tool(self._db, **params)
            if name == TERMINAL_TOOL:
                self._terminated = True
            return output

        return run

    @property
    def task(self) -> Task:
        """The task attempted."""
        return self._task

    @property
    def terminated(self) -> bool:
        """True once the user was handed to a human agent."""
        return self._terminated

    def skills(self) -> Sequence[Skill]:
        """The 16 tools as skills over this episode's databases."""
        return self._skills

    def state_hash(self) -> str:
        """Canonical hash of the three databases as this episode left them."""
        return self._db.state_hash()

    def outcome(self, messages_to_user: Sequence[str]) -> Outcome:
        """`state`: the databases equal the gold ones; `outputs`: every expected string was said."""
        said = [_normal(message) for message in messages_to_user]
        missing = [out for out in self._task.payload["outputs"] if not any(_normal(out) in m for m in said)]
        state_ok = self.state_hash() == self._env.gold_hash(self._task)
        details = [] if state_ok else ["the databases differ from the gold outcome"]
        details += [f"never told the user {', '.join(repr(m) for m in missing)}"] if missing else []
        return Outcome(checks={"state": state_ok, "outputs": not missing}, detail="; ".join(details))
