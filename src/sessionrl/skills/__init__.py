"""The pluggable skill library: YAML contracts, bindings (callable, HTTP, MCP, simulated, sandboxed) and
an executor that validates, limits, times, retries, breaks and falls back.

```python
contract = load_contract("examples/skills/crp_test_request.yaml")
async with SkillExecutor([callable_skill(contract, order_crp)]) as executor:
    result = await executor.call("crp_test_request", {"patient_id": "p1"})
```
"""

from sessionrl.skills.bindings import CallableSkill, SimulatedSkill, callable_skill, simulated_skill
from sessionrl.skills.breaker import BreakerState, CircuitBreaker
from sessionrl.skills.checker import check_fallback, check_skill
from sessionrl.skills.clock import Clock, ManualClock, SystemClock
from sessionrl.skills.contract import (
    BreakerPolicy,
    ErrorSpec,
    RateLimit,
    RiskLevel,
    SimulationProfile,
    SkillContract,
    Sla,
    load_contract,
    load_contracts,
    parse_contract,
)
from sessionrl.skills.errors import STANDARD_RETRYABLE, ContractError, ErrorCode, SkillCheckError, SkillError
from sessionrl.skills.executor import ExecutorConfig, SkillExecutor
from sessionrl.skills.http_binding import HttpSkill, http_skill
from sessionrl.skills.mcp_binding import McpSkill, mcp_skill
from sessionrl.skills.sandbox import SandboxedSkill, SandboxLimits, sandboxed_skill
from sessionrl.skills.skill import Skill, SkillResult
from sessionrl.skills.stats import SkillStats

__all__ = [
    "STANDARD_RETRYABLE",
    "BreakerPolicy",
    "BreakerState",
    "CallableSkill",
    "CircuitBreaker",
    "Clock",
    "ContractError",
    "ErrorCode",
    "ErrorSpec",
    "ExecutorConfig",
    "HttpSkill",
    "ManualClock",
    "McpSkill",
    "RateLimit",
    "RiskLevel",
    "SandboxLimits",
    "SandboxedSkill",
    "SimulatedSkill",
    "SimulationProfile",
    "Skill",
    "SkillCheckError",
    "SkillContract",
    "SkillError",
    "SkillExecutor",
    "SkillResult",
    "SkillStats",
    "Sla",
    "SystemClock",
    "callable_skill",
    "check_fallback",
    "check_skill",
    "http_skill",
    "load_contract",
    "load_contracts",
    "mcp_skill",
    "parse_contract",
    "sandboxed_skill",
    "simulated_skill",
]
