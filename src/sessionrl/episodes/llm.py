"""A language-model policy as an agent: it reads the conversation and answers with one action a turn,
written in its backend's tool-call format (`sessionrl.policy.toolcalls`: the action language, or
`<tool_call>` JSON and the model's native syntax) and read into one `ParsedReply`.

    system prompt and the user's request
    LLM step, the policy choosing ──▶ its JSON action; a tool call runs and its result is appended as a
        tool message, or a reply that is no action is answered (and charged an `auto_validation` of 0)
    ... until the policy answers {"final": ...}, the domain ends the task, `max_steps` policy calls, or
        `max_invalid` replies in a row that are not actions

References in the policy's actions (`{{user.item}}`, `{{waybill_generate.id}}`) are resolved against the
conversation before the call runs, and in the final message before the session records it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from sessionrl.envs.base import DecisionEnv, Task
from sessionrl.episodes.config import RolloutConfig
from sessionrl.episodes.driver import Attempt
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.policy import PolicyBackend
from sessionrl.orchestrator.results import LLMPayload, StepKind, StepResult, ToolPayload
from sessionrl.policy.llm import system_prompt, tool_message
from sessionrl.policy.references import Context, resolve
from sessionrl.policy.toolcalls import ToolFormat, parse_reply, tool_format_of
from sessionrl.session.model import Anchor, CallPurpose, Feedback, FeedbackType, Message

UNPARSEABLE = "UNPARSEABLE_ACTION"
"""Error code of the tool message that answers a reply which is neither a tool call nor a final answer."""

NOT_AN_ACTION = {
    ToolFormat.ACTION: 'not an action: answer {"tool": ..., "params": {...}} or {"final": ...}',
    ToolFormat.TAGGED: 'not a tool call: write <tool_call>{"name": ..., "arguments": {...}}</tool_call>',
    ToolFormat.NATIVE: "not a tool call in the model's own format, nor an answer",
}
"""What the tool message says to a reply that is no action, by format."""


def prompt_messages(
    env: DecisionEnv, task: Task, config: RolloutConfig, fmt: ToolFormat = ToolFormat.ACTION
) -> list[Message]:
    """The conversation an episode starts from: the system prompt (tool calls in format `fmt`) and the
    user's request."""
    policy = env.system_prompt() if config.domain_policy else f"You act for the {env.name} service."
    system = system_prompt(policy, env.contracts(), full_schemas=config.full_schemas, fmt=fmt)
    return [
        Message(role="system", content=system),
        Message(role="user", content=task.instruction),
    ]


def observation(tool: str, result: StepResult, max_chars: int) -> Message:
    """The result of a call of `tool` as the agent reads it: the output, or why the step failed."""
    return tool_message(
        tool=tool,
        ok=result.ok,
        output=result.output,
        error_code=result.error_code,
        error_message=result.error_message,
        max_chars=max_chars,
    )


@dataclass(frozen=True, slots=True)
class PolicyAgent:
    """The policy `backend` (of version `policy_version`) acting as the module doc says."""

    backend: PolicyBackend
    policy_version: int | None = None
    name: str = "llm"

    @property
    def backends(self) -> Sequence[PolicyBackend]:
        """The backend that serves the episode's LLM steps."""
        return (self.backend,)

    def engine_config(self, base: OrchestratorConfig, tasks: Sequence[Task]) -> OrchestratorConfig:
        """`base` unchanged: the policy makes no plan step, so the plan guards never meet it."""
        return base

    async def act(self, attempt: Attempt) -> str | None:
        """Ask the policy for actions and carry them out until it answers, or the episode is cut off."""
        engine, sid, config = attempt.engine, attempt.session_id, attempt.config
        fmt = tool_format_of(self.backend)
        messages = prompt_messages(attempt.env, attempt.spec.task, config, fmt)
        final: str | None = None
        invalid = 0
        for _ in range(config.max_steps):
            payload = LLMPayload(messages=tuple(messages), purpose=CallPurpose.ACT)
            asked = await engine.execute_step(sid, StepKind.LLM, payload)
            if not asked.ok:
                break
            final = await _carry_out(engine, sid, asked, messages, config, fmt)
            invalid = invalid + 1 if _was_invalid(messages) else 0
            if final is not None or attempt.episode.terminated or invalid >= config.max_invalid:
                break
        return final


async def _carry_out(
    engine: Orchestrator,
    sid: str,
    asked: StepResult,
    messages: list[Message],
    config: RolloutConfig,
    fmt: ToolFormat,
) -> str | None:
    """Carry out one reply of the policy: the final message it gives (references resolved), or None after
    running the tool call it asks for in `messages`.

    A reply that is neither is answered in `messages` and recorded as an `auto_validation` verdict of 0
    anchored to the LLM call, so rewards can charge the reply that broke the format."""
    text = asked.text or ""
    messages.append(Message(role="assistant", content=text))
    context = Context.from_messages(messages)
    reply = parse_reply(fmt, text, seed=asked.call_id or sid)
    if reply.is_final:
        return str(resolve(reply.text, context))
    if not reply.valid:
        why = NOT_AN_ACTION[fmt]
        messages.append(tool_message(tool=None, ok=False, error_code=UNPARSEABLE, error_message=why))
        charge = Feedback(
            type=FeedbackType.AUTO_VALIDATION,
            score=0.0,
            comment=f"{UNPARSEABLE}: {why}",
            annotator="action_parser",
            anchor=Anchor(call_id=asked.call_id),
        )
        await engine.inject_feedback(sid, charge)
        return None
    call = reply.tool_calls[0]  # one call a turn: the next reply sees its result
    params = resolve(orjson.loads(call.arguments), context)
    result = await engine.execute_step(sid, StepKind.TOOL, ToolPayload(tool=call.name, params=params))
    messages.append(observation(call.name, result, config.max_tool_chars))
    return None


def _was_invalid(messages: Sequence[Message]) -> bool:
    """Whether the last reply was not an action (its answer is the UNPARSEABLE tool message)."""
    last = messages[-1]
    return last.role == "tool" and f'"error":"{UNPARSEABLE}"' in last.content
