"""A tool-call head for the LLM policy: a small classifier on the LM's hidden state that picks the tool.

The LM acts in `llm.tool_action`'s language, ``{"tool":"NAME","params":{...}}`` or ``{"final":"..."}``.
The head reads the hidden state of the prompt's last token (the final layer, `prompt_states`) and scores
every tool and *final* (`ToolHead.classes`). Masked classes (tools whose preconditions fail) get ``-inf``
before the softmax. `HeadGuide` imposes its choice on the LM (the policy's `llm.ReplyGuide` hook): the
prompt is extended with ``{"tool":"NAME","params`` so the model generates only the parameters; for
*final* with ``{"final``, and the reply's text starts with that prefix. The prefix stops after a word, not
after the ``":`` that follows it: a byte-level tokenizer splits words from punctuation before merging, so
text cut there is tokenized as it was in the replies the model learned from, whereas a cut inside the
punctuation run ``":{"`` leaves a token the model never saw end a prompt (it then wrote numbers where the
parameters' ``{`` belonged, and no guided reply parsed).

`tool_examples` draws the training examples from stored sessions, the same ones imitation learns from:
each recorded policy call whose reply was a tool call or a final answer, labelled with that choice.
`fit_tool_head` trains the head alone on the frozen LM's states.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson
import torch
from torch import Tensor, nn

from sessionrl.policy.llm import HFPolicy, final_action, tool_action
from sessionrl.policy.sampling import left_pad
from sessionrl.policy.structured import masked_logits
from sessionrl.policy.toolcalls import ToolFormat
from sessionrl.session.model import ACTING, Message, Session

FINAL = "final"
"""The class of a final answer."""


class ToolHead(nn.Module):
    """One linear layer from the LM's hidden size to the tools and *final*."""

    def __init__(self, hidden_size: int, tools: Sequence[str]) -> None:
        super().__init__()
        self.classes = (*tools, FINAL)
        self.score = nn.Linear(hidden_size, len(self.classes))

    def forward(self, states: Tensor, mask: Tensor | None = None) -> Tensor:
        """Logits ``[B, C]`` for states ``[B, H]``; ``-inf`` where `mask` ``[B, C]`` is 0."""
        logits: Tensor = self.score(states)
        return logits if mask is None else masked_logits(logits, mask)

    def mask(self, allowed: Sequence[Sequence[str]]) -> Tensor:
        """``[B, C]`` masks from each row's allowed tool names (*final* is always allowed)."""
        rows = [[name in set(names) or name == FINAL for name in self.classes] for names in allowed]
        return torch.tensor(rows, dtype=torch.bool)


@torch.no_grad()
def prompt_states(policy: HFPolicy, prompts: Sequence[Sequence[int]]) -> Tensor:
    """``[B, H]`` final-layer hidden states at the last token of each encoded prompt (left-padded batch)."""
    device = next(policy.model.parameters()).device
    ids, attention = (t.to(device) for t in left_pad(prompts, int(policy.tokenizer.pad_token_id)))
    positions = (attention.cumsum(-1) - 1).clamp_min(0)
    out = policy.model(
        input_ids=ids, attention_mask=attention, position_ids=positions, output_hidden_states=True
    )
    states: Tensor = out.hidden_states[-1][:, -1].float().cpu()
    return states


@dataclass(frozen=True)
class ToolExample:
    """A conversation up to a policy reply and the class the reply chose (a tool name or *final*)."""

    messages: tuple[Message, ...]
    label: str


def reply_class(text: str) -> str | None:
    """The tool a reply calls, *final* for an answer, None for anything else.

    >>> reply_class('{"tool":"refund","params":{}}'), reply_class('{"final":"ok"}'), reply_class("hm")
    ('refund', 'final', None)
    """
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get("tool"), str):
        return str(parsed["tool"])
    return FINAL if isinstance(parsed, dict) and "final" in parsed else None


def tool_examples(sessions: Sequence[Session]) -> list[ToolExample]:
    """Every call of `sessions` in which the policy acted (`ACTING`: an orchestrator step, an episode's
    action, a captured chat) and whose reply was an action, with its class."""
    examples = []
    for session in sessions:
        for call in session.llm_calls:
            label = reply_class(call.response)
            if call.purpose in ACTING and label is not None:
                examples.append(ToolExample(call.messages, label))
    return examples


def fit_tool_head(
    head: ToolHead, states: Tensor, labels: Sequence[str], *, epochs: int = 200, lr: float = 0.05
) -> list[float]:
    """Cross-entropy on `states` ``[N, H]`` (detached LM states) and their classes; the loss per epoch."""
    target = torch.tensor([head.classes.index(label) for label in labels])
    optimiser = torch.optim.Adam(head.parameters(), lr=lr)
    losses = []
    for _ in range(epochs):
        loss = nn.functional.cross_entropy(head(states), target)
        optimiser.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        optimiser.step()
        losses.append(loss.item())
    return losses


def forced_prefix(choice: str) -> str:
    """The start of the reply the head's `choice` imposes, cut after its last word (see the module doc);
    the LM writes the rest, from the ``":`` on.

    >>> forced_prefix("refund"), forced_prefix("final")
    ('{"tool":"refund","params', '{"final')
    """
    if choice == FINAL:
        return final_action("")[: -len('":""}')]
    return tool_action(choice, {})[: -len('":{}}')]


class HeadGuide:
    """The head as the LM's `llm.ReplyGuide` (install it as ``policy.guide = HeadGuide(policy, head)``):
    before every reply it scores the prompt's last hidden state, masks the classes `allowed` rules out
    for the conversation (all allowed when None), and imposes `forced_prefix` of the best class."""

    def __init__(
        self,
        policy: HFPolicy,
        head: ToolHead,
        allowed: Callable[[Sequence[Message]], Sequence[str]] | None = None,
    ) -> None:
        if policy.tool_format is not ToolFormat.ACTION:
            raise ValueError(
                f"HeadGuide imposes the action language's prefixes; this policy writes tool calls in the "
                f"{policy.tool_format} format"
            )
        self.policy = policy
        self.head = head
        self.allowed = allowed

    @torch.no_grad()
    def choose(
        self, prompts: Sequence[Sequence[int]], allowed: Sequence[Sequence[str]] | None = None
    ) -> list[str]:
        """The head's class for each encoded prompt (masked by `allowed` names per row when given)."""
        mask = self.head.mask(allowed) if allowed is not None else None
        best = self.head(prompt_states(self.policy, prompts), mask).argmax(-1)
        return [self.head.classes[i] for i in best.tolist()]

    def __call__(self, messages: Sequence[Message], prompt: Sequence[int]) -> str:
        allowed = [self.allowed(messages)] if self.allowed is not None else None
        return forced_prefix(self.choose([prompt], allowed)[0])


def accuracy(chosen: Sequence[str | None], labels: Sequence[str]) -> float:
    """Share of `chosen` classes equal to `labels` (a None choice is wrong)."""
    if len(chosen) != len(labels) or not labels:
        raise ValueError("accuracy needs as many choices as labels, at least one")
    return sum(c == label for c, label in zip(chosen, labels, strict=True)) / len(labels)


__all__ = [
    "FINAL",
    "HeadGuide",
    "ToolExample",
    "ToolHead",
    "accuracy",
    "fit_tool_head",
    "forced_prefix",
    "prompt_states",
    "reply_class",
    "tool_examples",
]
