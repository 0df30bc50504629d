"""The inference-engine boundary: the one way rollouts, evaluation and the gateway's policy sample.

An `Engine` continues encoded prompts and says, for every completion, which tokens it drew, the
log-probability of each under the distribution it was drawn from, and the policy version whose weights
drew them. Three engines implement it:

- `sessionrl.policy.sampling.TorchEngine` (the default): our batched torch sampler over the trainer's
  own module, which keeps each conversation's key/value cache across its turns and, on a CPU with
  bfloat16 units, multiplies the linear layers in bfloat16 (logprobs within about 0.01 nats);
- `sessionrl.policy.ortgenai.OrtGenAIEngine` (CPU, LoRA runs, `model.engine: ortgenai`): onnxruntime-genai
  over the checkpoint converted once to float32 ONNX, its LoRA weights hot-loaded after each update;
- `sessionrl.policy.vllm.VLLMEngine` (GPUs): an OpenAI-compatible vLLM server asked for token ids and
  logprobs, whose weights follow the trainer through LoRA hot-loading.

The policy version is explicit: after every update or weight load the trainer hands the engine the model
and its new version (`Engine.refresh`), and whatever the engine kept from older weights is dropped then.
Nothing inspects the weights to find out whether they changed. Before an update the trainer also calls
`Engine.release`, so that what the engine keeps for the outgoing weights does not sit beside the update's
activations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from sessionrl.policy.llm import SamplingConfig


@dataclass(frozen=True, slots=True)
class Completion:
    """One sampled continuation of a prompt.

    `token_ids` end with the stop token when one was drawn; `logprobs[i]` is the log-probability of
    `token_ids[i]` under the distribution it was drawn from (softmax of logits / temperature; plain
    softmax when greedy), which is what the trainer's importance ratios divide by.
    """

    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    policy_version: int

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")


class Engine(Protocol):
    """Samples continuations of encoded prompts with the weights of one policy version."""

    @property
    def version(self) -> int:
        """The policy version the engine samples with now."""
        ...

    def sample(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, generator: torch.Generator
    ) -> list[Completion]:
        """Continue every prompt (one batch, blocking) until a stop token or `sampling.max_new_tokens`.
        Random draws come from `generator`, so a seeded caller samples the same replies again."""
        ...

    def refresh(self, model: Any, version: int) -> None:
        """Serve `model`'s current weights from now on, as policy `version`; drop what older weights left."""
        ...

    def release(self) -> None:
        """Give back the memory held only to sample the current weights faster (caches, copies): the
        trainer calls it before it changes them, when nothing held can serve again. A batch sampled after
        it computes what it needs."""
        ...


__all__ = ["Completion", "Engine"]
