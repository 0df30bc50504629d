"""τ-bench-style domains: JSON tables with inserts, the canonical hash, the success rule, contracts from
`tools.json`, the gold-plan replay, an expert scaffold and the tools every domain shares (`SHARED_TOOLS`:
`calculate`, `think`, `transfer_to_human_agents`). A domain is its data folder, its tools and its expert:
subclass `TauEnv` (see `taubench.env` and docs/new-domain.md)."""

from sessionrl.envs.taubench.data import DataMissing, Record, TauData, TauDb, resolve_data_dir
from sessionrl.envs.taubench.env import TauEnv, TauEpisode, build_contracts, judge
from sessionrl.envs.taubench.expert import PlanBuilder, final_message, gold_expert
from sessionrl.envs.taubench.gold import gold_plan
from sessionrl.envs.taubench.shared import (
    SHARED_ERRORS,
    SHARED_EXAMPLES,
    SHARED_SCHEMAS,
    SHARED_TOOLS,
    calculate,
    think,
    transfer_to_human_agents,
)
from sessionrl.envs.taubench.tools import Json, Tool, apply_actions, tool, toolbox

__all__ = [
    "SHARED_ERRORS",
    "SHARED_EXAMPLES",
    "SHARED_SCHEMAS",
    "SHARED_TOOLS",
    "DataMissing",
    "Json",
    "PlanBuilder",
    "Record",
    "TauData",
    "TauDb",
    "TauEnv",
    "TauEpisode",
    "Tool",
    "apply_actions",
    "build_contracts",
    "calculate",
    "final_message",
    "gold_expert",
    "gold_plan",
    "judge",
    "resolve_data_dir",
    "think",
    "tool",
    "toolbox",
    "transfer_to_human_agents",
]
