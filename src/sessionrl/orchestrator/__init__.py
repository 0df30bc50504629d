"""The session orchestrator: runs plan, tool and LLM steps of Decision Sessions behind guards, in lanes,
committing every change to the store before acknowledging it.

```python
async with Orchestrator(store, executor, [backend]) as engine:
    sid = await engine.init_session("Where is my order?")
    await engine.execute_step(sid, "plan", {"plan": plan})
    await engine.execute_step(sid, "tool", {"tool": "find_order", "subgoal_id": "g1"})
    await engine.finish(sid, "It ships tomorrow.")
```
"""

from sessionrl.orchestrator.config import LaneConfig, OrchestratorConfig
from sessionrl.orchestrator.engine import Executor, Orchestrator
from sessionrl.orchestrator.guards import PlanProblem, PlanRejection, Refusal, StepRefusal
from sessionrl.orchestrator.lanes import Overloaded
from sessionrl.orchestrator.policy import PolicyBackend, PolicyError, PolicyReply, ScriptedBackend
from sessionrl.orchestrator.results import (
    FeedbackResult,
    FinishResult,
    KeyReused,
    LLMPayload,
    PlanPayload,
    StepError,
    StepKind,
    StepResult,
    ToolPayload,
)

__all__ = [
    "Executor",
    "FeedbackResult",
    "FinishResult",
    "KeyReused",
    "LLMPayload",
    "LaneConfig",
    "Orchestrator",
    "OrchestratorConfig",
    "Overloaded",
    "PlanPayload",
    "PlanProblem",
    "PlanRejection",
    "PolicyBackend",
    "PolicyError",
    "PolicyReply",
    "Refusal",
    "ScriptedBackend",
    "StepError",
    "StepKind",
    "StepRefusal",
    "StepResult",
    "ToolPayload",
]
