"""`TauEnv`: a τ-bench-style domain as a `DecisionEnv`, given its tables, its tools and its expert.

A domain subclasses `TauEnv` and sets what is its own:

```python
class ShopEnv(TauEnv):
    name = "shop"
    tables = ("customers", "orders")
    tools = (find_customer, get_order, cancel_order)      # functions marked with `@tool`
    errors = {"NOT_FOUND": "No such customer or order."}  # the meaning of every code a tool raises
    data_variable = "SHOP_DATA"                           # optional: where the folder comes from by default

    def expert(self, task: Task) -> ExpertPlan:           # optional: the default replays the gold actions
        ...
```

Everything else is shared: the data folder (`taubench.data`), one skill contract per tool of `tools.json`,
tasks read from `tasks_<split>.json`, episodes over a private copy of the tables, and the benchmark's
success rule (`judge`): the tables after the agent's calls must equal the tables after the task's gold
actions (compared by canonical hash), and every expected output string must appear in some message to
the user (case-insensitive, commas removed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from sessionrl.envs.base import Episode, ExpertPlan, Outcome, Split, Task
from sessionrl.envs.faults import Faults, with_faults
from sessionrl.envs.registry import EnvBuildError
from sessionrl.envs.taubench.data import TauData, TauDb, resolve_data_dir
from sessionrl.envs.taubench.expert import gold_expert
from sessionrl.envs.taubench.gold import gold_plan
from sessionrl.envs.taubench.shared import SHARED_EXAMPLES, SHARED_SCHEMAS, SHARED_TOOLS
from sessionrl.envs.taubench.tools import Json, Tool, apply_actions, toolbox
from sessionrl.skills import RiskLevel, Skill, SkillContract, callable_skill
from sessionrl.skills.skill import JsonValue

Examples = Mapping[str, Sequence[Json]]
"""Valid calls per tool name, for the contracts' `examples`."""


def check_tools(tool_schemas: Sequence[Mapping[str, Any]], tools: Mapping[str, Tool[...]]) -> None:
    """Raise `EnvBuildError` unless `tools.json` names exactly the domain's tool functions."""
    named = [schema["function"]["name"] for schema in tool_schemas]
    if sorted(named) != sorted(tools):
        raise EnvBuildError(
            f"tools.json names {sorted(set(named) - set(tools)) or 'no tool'} without a function and the "
            f"functions {sorted(set(tools) - set(named)) or 'none'} have no schema; make the two lists agree"
        )


def build_contracts(
    tool_schemas: Sequence[Mapping[str, Any]],
    tools: Mapping[str, Tool[...]],
    errors: Mapping[str, str],
    examples: Examples,
) -> tuple[SkillContract, ...]:
    """One contract per OpenAI function schema of `tools.json`, sorted by name: unknown parameters are
    refused, the tool's error codes are final, tools that write are high risk.

    Raises `EnvBuildError` when `tools.json` and `tools` name different tools, or a code has no meaning.
    """
    check_tools(tool_schemas, tools)
    contracts = []
    for schema in tool_schemas:
        function = schema["function"]
        spec = tools[function["name"]]
        unexplained = sorted(set(spec.errors) - set(errors))
        if unexplained:
            raise EnvBuildError(
                f"tool {spec.name} raises {unexplained}; give each code a meaning in `errors`"
            )
        contract = {
            "name": spec.name,
            "description": function["description"],
            "input_schema": {**function["parameters"], "additionalProperties": False},
            "errors": {code: {"retryable": False, "description": errors[code]} for code in spec.errors},
            "risk": RiskLevel.HIGH if spec.writes else RiskLevel.LOW,
            "examples": tuple(examples.get(spec.name, ())),
        }
        contracts.append(SkillContract.model_validate(contract))
    return tuple(sorted(contracts, key=lambda c: c.name))


def _normal(text: str) -> str:
    return text.lower().replace(",", "")


def judge(
    state_hash: str, gold_hash: str, outputs: Sequence[str], messages_to_user: Sequence[str]
) -> Outcome:
    """The benchmark's rule. `state`: the tables equal the gold ones; `outputs`: every expected string was
    said to the user (case-insensitive, commas removed).

    >>> judge("a", "a", ["1,093.34"], ["Your total is 1093.34"]).success
    True
    >>> judge("a", "b", ["x"], []).checks
    {'state': False, 'outputs': False}
    """
    said = [_normal(message) for message in messages_to_user]
    missing = [out for out in outputs if not any(_normal(out) in message for message in said)]
    state_ok = state_hash == gold_hash
    details = [] if state_ok else ["the databases differ from the gold outcome"]
    details += [f"never told the user {', '.join(repr(m) for m in missing)}"] if missing else []
    return Outcome(checks={"state": state_ok, "outputs": not missing}, detail="; ".join(details))


def with_shared_schemas(
    tool_schemas: Sequence[Mapping[str, Any]], tools: Mapping[str, Tool[...]]
) -> list[Mapping[str, Any]]:
    """`tool_schemas` and, for each shared tool in `tools` that they do not describe, its `SHARED_SCHEMAS`."""
    named = {schema["function"]["name"] for schema in tool_schemas}
    shared = [t.name for t in SHARED_TOOLS if tools.get(t.name) is t and t.name not in named]
    return [*tool_schemas, *(SHARED_SCHEMAS[name] for name in shared)]


class TauEnv:
    """A τ-bench-style domain over one data folder (see `taubench.data`); subclasses set the class
    attributes below and may override `expert` and `examples`. Loads the data once."""

    name: str
    """A short identifier; task ids are `<name>-<split>-<index>`."""
    tables: tuple[str, ...]
    """The tables of the data folder, one `<table>.json` each."""
    tools: tuple[Tool[...], ...]
    """The domain's tools; `tools.json` names exactly these."""
    errors: ClassVar[Mapping[str, str]] = {}
    """The meaning of every error code the tools raise."""
    data_variable: str | None = None
    """An environment variable naming the data folder when none is given."""
    data_source: str = ""
    """Where to get the data, said when the folder is missing."""

    def __init__(self, data: str | Path | TauData | None = None) -> None:
        missing = [attr for attr in ("name", "tables", "tools") if not hasattr(self, attr)]
        if missing:
            raise EnvBuildError(f"{type(self).__name__} must set {', '.join(missing)} (see TauEnv)")
        self.data = data if isinstance(data, TauData) else self.load_data(data)
        self.toolbox = toolbox(self.tools)
        schemas = with_shared_schemas(self.data.tool_schemas, self.toolbox)
        check_tools(schemas, self.toolbox)
        self._tasks = {
            split: tuple(self._task(split, i, raw) for i, raw in enumerate(self.data.raw_tasks(split)))
            for split in Split
        }
        self._contracts = build_contracts(schemas, self.toolbox, self.errors, self.contract_examples())
        self._gold_hashes: dict[str, str] = {}

    @classmethod
    def load_data(cls, data: str | Path | None = None) -> TauData:
        """Read the folder `data` (else `$data_variable`); raises `DataMissing` saying how to provide it."""
        folder = resolve_data_dir(
            cls.name, cls.tables, data, variable=cls.data_variable, source=cls.data_source
        )
        return TauData(folder, cls.tables)

    def _task(self, split: Split, index: int, raw: Mapping[str, Any]) -> Task:
        payload = {key: value for key, value in raw.items() if key not in ("instruction", "task_index")}
        payload.setdefault("outputs", [])
        task_id = f"{self.name}-{split.value}-{index}"
        if "actions" not in payload:
            raise EnvBuildError(f"{task_id} has no gold actions; each task of tasks_{split}.json needs some")
        unknown = sorted({action["name"] for action in payload["actions"]} - set(self.toolbox))
        if unknown:
            raise EnvBuildError(f"{task_id}'s gold actions call {unknown}, which are not among the tools")
        return Task(task_id=task_id, split=split, instruction=raw["instruction"], payload=payload)

    def system_prompt(self) -> str:
        """The domain policy (`wiki.md`)."""
        return self.data.policy

    def contracts(self) -> Sequence[SkillContract]:
        """One contract per tool, sorted by name."""
        return self._contracts

    def tasks(self, split: Split) -> Sequence[Task]:
        """The tasks of `split` in file order."""
        return self._tasks[split]

    def fresh_db(self) -> TauDb:
        """A fresh copy of the tables."""
        return TauDb(self.data)

    def episode(self, task: Task, *, seed: int = 0, faults: Faults | None = None) -> TauEpisode:
        """A fresh copy of the tables with skills bound to it."""
        return TauEpisode(self, task, seed=seed, faults=faults)

    def expert(self, task: Task) -> ExpertPlan:
        """A plan solving `task`; by default its gold actions in turn (see `gold_expert`)."""
        return gold_expert(task, self.fresh_db(), self.toolbox)

    def gold_plan(self, task: Task) -> ExpertPlan:
        """The task's gold actions as the benchmark replays them (see `taubench.gold_plan`)."""
        return gold_plan(task)

    def gold_hash(self, task: Task) -> str:
        """The state hash after the task's gold actions on a fresh copy (computed once per task)."""
        if task.task_id not in self._gold_hashes:
            db = self.fresh_db()
            apply_actions(db, self.toolbox, task.payload["actions"])
            self._gold_hashes[task.task_id] = db.state_hash()
        return self._gold_hashes[task.task_id]

    def examples(self) -> dict[str, list[Json]]:
        """Valid calls the domain gives itself, by tool; override for tools that neither the gold actions
        nor the expert's reads use (`check_env` warns about a tool without any). None by default."""
        return {}

    def contract_examples(self) -> dict[str, list[Json]]:
        """One valid call per tool: `examples()`, else a shared tool's own (`SHARED_EXAMPLES`), else the
        first gold action calling it, else the first call to it in the expert's plans when it only reads
        (tasks in split order)."""
        examples = self.examples()
        for shared in SHARED_TOOLS:
            if self.toolbox.get(shared.name) is shared:
                examples.setdefault(shared.name, SHARED_EXAMPLES[shared.name])
        tasks = [task for split in Split for task in self._tasks[split]]
        for task in tasks:
            for action in task.payload["actions"]:
                examples.setdefault(action["name"], [dict(action["kwargs"])])
        for task in tasks:
            if len(examples) >= len(self.toolbox):
                break
            for step in self.expert(task).steps:
                if not self.toolbox[step.tool].writes:
                    examples.setdefault(step.tool, [dict(step.params)])
        return examples


class TauEpisode(Episode):
    """One task over its own copy of the tables."""

    def __init__(self, env: TauEnv, task: Task, *, seed: int, faults: Faults | None) -> None:
        self._env = env
        self._task = task
        self._db = env.fresh_db()
        self._terminated = False
        bound = [callable_skill(contract, self._bind(contract.name)) for contract in env.contracts()]
        self._skills = with_faults(bound, faults, seed)

    def _bind(self, name: str) -> Callable[[Json], JsonValue]:
        tool = self._env.toolbox[name]

        def run(params: Json) -> JsonValue:
            output = tool(self._db, **params)
            if tool.ends_episode:
                self._terminated = True
            return output

        return run

    @property
    def task(self) -> Task:
        """The task attempted."""
        return self._task

    @property
    def terminated(self) -> bool:
        """True once a tool that ends the episode ran (a hand-off to a human agent)."""
        return self._terminated

    @property
    def db(self) -> TauDb:
        """This episode's tables."""
        return self._db

    def skills(self) -> Sequence[Skill]:
        """The tools as skills over this episode's tables."""
        return self._skills

    def state_hash(self) -> str:
        """Canonical hash of the tables as this episode left them."""
        return self._db.state_hash()

    def outcome(self, messages_to_user: Sequence[str]) -> Outcome:
        """The benchmark's rule (see `judge`)."""
        gold = self._env.gold_hash(self._task)
        return judge(self.state_hash(), gold, self._task.payload["outputs"], messages_to_user)
