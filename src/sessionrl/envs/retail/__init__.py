"""The public τ-bench retail domain (data folder given as a path, else `$SESSIONRL_RETAIL_DATA`)."""

from sessionrl.envs.registry import register
from sessionrl.envs.retail.env import DATA_ENV_VAR, RetailEnv

register("retail", RetailEnv)

__all__ = ["DATA_ENV_VAR", "RetailEnv"]
