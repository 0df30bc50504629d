"""The public τ-bench retail domain (data folder given as a path; see `resolve_data_dir`)."""

from sessionrl.envs.retail.data import DATA_ENV_VAR, RetailData, RetailDataMissing, RetailDb, resolve_data_dir
from sessionrl.envs.retail.env import (
    RetailEnv,
    RetailEpisode,
    apply_actions,
    build_contracts,
    contract_examples,
)

__all__ = [
    "DATA_ENV_VAR",
    "RetailData",
    "RetailDataMissing",
    "RetailDb",
    "RetailEnv",
    "RetailEpisode",
    "apply_actions",
    "build_contracts",
    "contract_examples",
    "resolve_data_dir",
]
