"""A Hugging Face causal LM as the orchestrator's policy backend: prompts, actions, batched sampling, LoRA.

The policy speaks one small action language, compact JSON in the assistant's text::

    {"tool":"inventory_check","params":{"sku":"A-1"}}     call a tool
    {"final":"Your order ships tomorrow."}                 answer the user and end

`system_prompt` tells the model the domain policy, this format and every tool (each contract's OpenAI
schema); `tool_message` renders what a call returned as the next ``tool`` message. The expert
demonstrations used for imitation are rendered with the same functions, so training and sampling see the
same text.

`HFPolicy` answers the orchestrator (`PolicyBackend`). Concurrent sessions ask one at a time; a small
batcher gathers the requests that arrive within a few milliseconds and has its engine
(`sessionrl.policy.engine`: our torch sampler by default, a vLLM server on GPUs) sample them as one
batch. Every reply carries the prompt's token ids,
the sampled ids, the log-probability of each sampled token under the distribution it was drawn from
(softmax of logits / temperature; plain softmax when greedy) and the policy version, which is what the
trainer needs to compute importance ratios later.

Nothing here depends on the tiny model: `HFPolicy.load` reads any local checkpoint (a Qwen folder on a
GPU, say) on the device and dtype of `default_placement()`.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import orjson
import torch

from sessionrl.orchestrator.policy import PolicyError, PolicyReply
from sessionrl.policy.attention import FEW_QUERIES
from sessionrl.policy.engine import Completion, Engine
from sessionrl.policy.kvstore import KVStore
from sessionrl.policy.sampling import TorchEngine
from sessionrl.policy.toolcalls import (
    TAGGED_INSTRUCTIONS,
    TOOLS_HEADING,
    ToolFormat,
    format_for,
    listed_tools,
    tool_listing,
)
from sessionrl.session.model import Message
from sessionrl.skills.contract import SkillContract

ACTION_INSTRUCTIONS = (
    "Answer with one JSON object and nothing else. "
    'To call a tool: {"tool":"<name>","params":{...}}. '
    'To answer the user and finish: {"final":"<message>"}. '
    "In both, {{tool.field}} stands for a field of that tool's latest result and {{user.word}} for the id "
    "after that word in the request."
)

X = TypeVar("X")
Y = TypeVar("Y")

ReplyGuide = Callable[[Sequence[Message], Sequence[int]], str]
"""Given a conversation and its encoded prompt, the text the reply must start with ("" for none). The
policy appends it to the prompt and the model writes the rest (`HeadGuide` in bench/research/toolhead.py
imposes the tool its head chose, so the model writes only the parameters)."""


# the action language


def tool_action(tool: str, params: dict[str, Any]) -> str:
    """The assistant text that calls `tool` with `params` (compact JSON, keys in a fixed order).

    >>> tool_action("refund", {"order": "A1", "amount": 3})
    '{"tool":"refund","params":{"order":"A1","amount":3}}'
    """
    return orjson.dumps({"tool": tool, "params": params}).decode()


def final_action(text: str) -> str:
    """The assistant text that answers the user and ends the episode.

    >>> final_action("Done.")
    '{"final":"Done."}'
    """
    return orjson.dumps({"final": text}).decode()


def parse_final(text: str) -> str | None:
    """The message of a final answer written in `text`, or None when `text` is not one.

    >>> parse_final('{"final":"Refund issued."}'), parse_final('{"tool":"x","params":{}}')
    ('Refund issued.', None)
    """
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        data = orjson.loads(text[start : end + 1])
    except orjson.JSONDecodeError:
        return None
    if isinstance(data, dict) and set(data) == {"final"} and isinstance(data["final"], str):
        return data["final"]
    return None


def system_prompt(
    domain_policy: str,
    contracts: Sequence[SkillContract],
    *,
    full_schemas: bool = True,
    fmt: ToolFormat = ToolFormat.ACTION,
) -> str:
    """The system message: the domain policy, how to call tools in format `fmt`, then one line per tool.

    Each tool line is the contract's OpenAI schema as compact JSON, or, with ``full_schemas=False`` (for
    small models with short contexts), less of it. The action language gets `ACTION_INSTRUCTIONS` and the
    tagged format the `<tool_call>` instructions (`toolcalls.TAGGED_INSTRUCTIONS`), then the tools, cut to
    ``sms_send(template_id, phone, variables)`` when not in full. The native format says nothing of how to
    call: its chat template renders the tools (`HFPolicy.render` takes them from this message's
    `toolcalls.tool_listing`, whose schemas are cut to names, types and required parameters when not in
    full).
    """
    tools = [contract.to_openai_tool() for contract in sorted(contracts, key=_name)]
    if fmt is ToolFormat.NATIVE:
        listed = tools if full_schemas else [brief_schema(tool) for tool in tools]
        return f"{domain_policy.strip()}\n\n{tool_listing(listed)}"
    lines = [orjson.dumps(tool).decode() if full_schemas else signature(tool) for tool in tools]
    how = ACTION_INSTRUCTIONS if fmt is ToolFormat.ACTION else TAGGED_INSTRUCTIONS
    return f"{domain_policy.strip()}\n\n{how}\n{TOOLS_HEADING}\n" + "\n".join(lines)


def signature(tool: Mapping[str, Any]) -> str:
    """An OpenAI tool schema as its name and parameter names.

    >>> signature({"function": {"name": "sms_send", "parameters": {"properties": {"phone": {}}}}})
    'sms_send(phone)'
    """
    function = tool["function"]
    return f"{function['name']}({', '.join(function.get('parameters', {}).get('properties', {}))})"


def brief_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI tool schema without its descriptions: the name, each parameter's type, the required ones.

    >>> brief_schema({"function": {"name": "f", "description": "Finds.", "parameters": {
    ...     "type": "object", "properties": {"q": {"type": "string", "description": "what"}}}}})["function"]
    {'name': 'f', 'parameters': {'type': 'object', 'properties': {'q': {'type': 'string'}}, 'required': []}}
    """
    function = tool["function"]
    parameters = function.get("parameters", {})
    properties = {
        name: {"type": spec["type"]} if isinstance(spec, dict) and "type" in spec else {}
        for name, spec in parameters.get("properties", {}).items()
    }
    brief = {"type": "object", "properties": properties, "required": list(parameters.get("required", []))}
    return {"type": "function", "function": {"name": function["name"], "parameters": brief}}


def _name(contract: SkillContract) -> str:
    return contract.name


def tool_message(
    *,
    tool: str | None,
    ok: bool,
    output: Any = None,
    error_code: str | None = None,
    error_message: str | None = None,
    max_chars: int = 600,
) -> Message:
    """What a call of `tool` returned, as the ``tool`` message the policy reads next (cut to `max_chars`).

    >>> tool_message(tool="stock", ok=True, output={"on_hand": 3}).content
    '{"tool":"stock","ok":true,"output":{"on_hand":3}}'
    >>> tool_message(tool="stock", ok=False, error_code="TIMEOUT", error_message="no answer").content
    '{"tool":"stock","ok":false,"error":"TIMEOUT","message":"no answer"}'
    """
    body: dict[str, Any] = (
        {"tool": tool, "ok": True, "output": output}
        if ok
        else {"tool": tool, "ok": False, "error": error_code or "ERROR", "message": error_message or ""}
    )
    text = orjson.dumps(body, default=str).decode()
    return Message(role="tool", content=text if len(text) <= max_chars else text[:max_chars] + "…")


# configuration


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """How replies are drawn."""

    max_new_tokens: int = field(default=96, metadata={"help": "longest reply, in tokens"})
    temperature: float = field(default=1.0, metadata={"help": "softmax temperature; 0 samples greedily"})
    max_prompt_tokens: int = field(
        default=1792, metadata={"help": "longest prompt; older turns are dropped to fit"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the sampling generator"})

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.max_prompt_tokens < 8:
            raise ValueError("SamplingConfig needs max_new_tokens >= 1 and max_prompt_tokens >= 8")
        if self.temperature < 0:
            raise ValueError(f"SamplingConfig.temperature must be >= 0, got {self.temperature}")

    @property
    def greedy(self) -> bool:
        """True when replies are the most likely tokens, not samples."""
        return self.temperature == 0


KV_CACHES = ("model", "bfloat16")
"""What the torch engine may keep its key/value caches in (`BatchingConfig.kv_cache`)."""


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """How concurrent requests are gathered into one forward pass, and what the torch engine keeps
    between passes."""

    max_batch: int = field(default=32, metadata={"help": "most conversations sampled together"})
    gather_ms: float = field(
        default=20.0, metadata={"help": "a batch starts when no request arrived for this long"}
    )
    kv_cache: str = field(
        default="model",
        metadata={
            "help": "the torch engine's key/value caches: model (the model's dtype) or bfloat16 (half the "
            "memory, and faster on long episodes where the CPU multiplies bfloat16; docs/engines.md)"
        },
    )
    draft_tokens: int = field(
        default=0,
        metadata={
            "help": "the torch engine's draft: tokens each decode pass also checks, looked up where the "
            "reply's last tokens appeared before in its context; kept where the model would draw them, "
            "so replies are drawn as without (0: one token a pass; docs/engines.md)"
        },
    )

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.gather_ms < 0:
            raise ValueError("BatchingConfig needs max_batch >= 1 and gather_ms >= 0")
        if not 0 <= self.draft_tokens < FEW_QUERIES:
            raise ValueError(
                f"BatchingConfig.draft_tokens must be from 0 to {FEW_QUERIES - 1}, got {self.draft_tokens}"
            )
        if self.kv_cache not in KV_CACHES:
            raise ValueError(f"BatchingConfig.kv_cache must be one of {KV_CACHES}, got {self.kv_cache!r}")

    @property
    def kv_dtype(self) -> torch.dtype | None:
        """The dtype `kv_cache` names; None: the model's."""
        return torch.bfloat16 if self.kv_cache == "bfloat16" else None


@dataclass(frozen=True, slots=True)
class LoRAConfig:
    """Low-rank adapters on the top blocks of the model (through peft)."""

    rank: int = field(default=8, metadata={"help": "rank r of each adapter"})
    alpha: int = field(default=16, metadata={"help": "scale numerator: updates are scaled by alpha / r"})
    top_blocks: int = field(default=2, metadata={"help": "adapt only the last N transformer blocks"})
    targets: tuple[str, ...] = field(
        default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        metadata={"help": "names of the linear layers to adapt"},
    )

    def __post_init__(self) -> None:
        if self.rank < 1 or self.top_blocks < 1 or not self.targets:
            raise ValueError("LoRAConfig needs rank >= 1, top_blocks >= 1 and at least one target")


def with_lora(model: Any, config: LoRAConfig) -> Any:
    """`model` wrapped with LoRA adapters on its top `config.top_blocks` blocks; only those train."""
    from peft import LoraConfig, get_peft_model

    n_blocks = int(model.config.num_hidden_layers)
    first = max(n_blocks - config.top_blocks, 0)
    lora = LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=0.0,
        target_modules=list(config.targets),
        layers_to_transform=list(range(first, n_blocks)),
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():  # peft probes an attribute transformers has renamed
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, lora)


# the backend


class HFPolicy:
    """A local causal LM serving the orchestrator; the trainer updates its weights in place.

    Not safe to train and sample at the same moment: the training loop alternates the two. Whoever changes
    the weights raises `version` before the next sample: that is how the engine learns of them (the torch
    engine drops the caches the old weights computed, the vLLM engine loads the new adapters).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        sampling: SamplingConfig | None = None,
        batching: BatchingConfig | None = None,
        *,
        version: int = 0,
        tool_format: ToolFormat | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tool_format = tool_format or format_for(tokenizer)
        """How this policy writes tool calls (`sessionrl.policy.toolcalls`), by default as its chat template
        calls for."""
        self.sampling = sampling or SamplingConfig()
        self.batching = batching or BatchingConfig()
        self.generator = torch.Generator().manual_seed(self.sampling.seed)
        self.stop_ids = stop_ids_of(model, tokenizer)
        self.engine: Engine = engine or TorchEngine(
            model,
            pad_id=int(tokenizer.pad_token_id),
            stop_ids=self.stop_ids,
            store=KVStore(dtype=self.batching.kv_dtype),
            version=version,
            draft=self.batching.draft_tokens,
        )
        """What samples the replies (`sessionrl.policy.engine`): by default our torch sampler over `model`;
        views over the same weights share it."""
        self._model = model
        if self.engine.version != version:
            self.engine.refresh(model, version)
        self._batcher: Batcher[list[int], PolicyReply] = Batcher(
            self.sample_prompts, self.batching.max_batch, self.batching.gather_ms
        )
        self.calls = 0
        """Conversations answered so far."""
        self.guide: ReplyGuide | None = None
        """Forces the start of every reply when set (see `ReplyGuide`)."""

    @property
    def model(self) -> Any:
        """The module the trainer updates."""
        return self._model

    @model.setter
    def model(self, model: Any) -> None:
        """Replace the module (wrapped with LoRA adapters, say): the engine samples with it from now on."""
        self._model = model
        self.engine.refresh(model, self.version)

    def release(self) -> None:
        """Let the engine give back what it keeps for the current weights (`Engine.release`): call it
        before an update, when nothing sampled so far will be continued with these weights."""
        self.engine.release()

    def use(self, engine: Engine) -> None:
        """Sample through `engine` from now on, serving the current model as the current version."""
        version = self.version
        engine.refresh(self._model, version)
        self.engine = engine

    @property
    def version(self) -> int:
        """Policy version stamped on every reply. Setting it tells the engine the weights changed: the
        trainer raises it after each update and sets it after loading weights."""
        return self.engine.version

    @version.setter
    def version(self, version: int) -> None:
        self.engine.refresh(self._model, version)

    @classmethod
    def load(
        cls,
        path: str | Path,
        sampling: SamplingConfig | None = None,
        batching: BatchingConfig | None = None,
        *,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> HFPolicy:
        """A policy from a local checkpoint folder (device and dtype from `default_placement()`)."""
        from sessionrl.policy.tiny import load_policy

        model, tokenizer = load_policy(path, device=device, dtype=dtype)
        return cls(model, tokenizer, sampling, batching)

    def view(self, sampling: SamplingConfig) -> HFPolicy:
        """Another backend over the same weights, version and engine (with what it keeps), sampling
        differently (greedy evaluation)."""
        other = HFPolicy(
            self.model,
            self.tokenizer,
            sampling,
            self.batching,
            version=self.version,
            tool_format=self.tool_format,
            engine=self.engine,
        )
        other.guide = self.guide
        return other

    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The prompt text of a conversation, ending where the assistant's reply begins.

        In the native format the chat template renders the tools: `tools` (OpenAI tool schemas) when given,
        else those the system message lists (`system_prompt`), which then leave the message. The other
        formats take the messages as they are (their system message teaches the calls and lists the tools).
        """
        chat = [{"role": m.role, "content": m.content} for m in messages]
        extra: dict[str, Any] = {}
        if self.tool_format is ToolFormat.NATIVE:
            if chat and chat[0]["role"] == "system":
                chat[0]["content"], listed = listed_tools(chat[0]["content"])
                tools = tools or listed
                if not chat[0]["content"]:  # a system message that only listed the tools
                    del chat[0]
            if tools:
                extra["tools"] = list(tools)
        text = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, **extra)
        return str(text)

    def encode_prompt(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of the prompt; the oldest turns after the first two messages go until it fits."""
        kept = list(messages)
        while True:
            ids: list[int] = self.tokenizer.encode(self.render(kept, tools), add_special_tokens=False)
            if len(ids) <= self.sampling.max_prompt_tokens:
                return ids
            if len(kept) <= 3:
                raise PolicyError(
                    f"prompt of {len(ids)} tokens exceeds max_prompt_tokens="
                    f"{self.sampling.max_prompt_tokens} even without history"
                )
            del kept[2:4]

    def encode_reply(self, text: str) -> list[int]:
        """Ids of `text` written as a reply: its tokens, then the stop token that ends the turn."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)
        return [*ids, int(self.tokenizer.eos_token_id)]

    def guided_prompt(self, messages: Sequence[Message]) -> tuple[list[int], str]:
        """The prompt's ids, extended by the start the `guide` imposes on the reply, and that start."""
        prompt = self.encode_prompt(messages)
        start = self.guide(messages, prompt) if self.guide is not None else ""
        if start:
            prompt += self.tokenizer.encode(start, add_special_tokens=False)
        return prompt, start

    def generate_now(self, conversations: Sequence[Sequence[Message]]) -> list[PolicyReply]:
        """Answer several conversations as one batch, right now (blocking)."""
        guided = [self.guided_prompt(c) for c in conversations]
        replies = self.sample_prompts([prompt for prompt, _ in guided])
        return [_started(reply, start) for reply, (_, start) in zip(replies, guided, strict=True)]

    def sample_prompts(self, prompts: Sequence[Sequence[int]]) -> list[PolicyReply]:
        """Continue several encoded prompts as one batch through the engine (blocking)."""
        completions = self.engine.sample(prompts, self.sampling, self.generator)
        self.calls += len(prompts)
        return [self._reply(c) for c in completions]

    def _reply(self, drawn: Completion) -> PolicyReply:
        ids = drawn.token_ids
        body = ids[:-1] if ids and ids[-1] in self.stop_ids else ids
        return PolicyReply(
            text=self.tokenizer.decode(list(body), skip_special_tokens=False),
            prompt_token_ids=drawn.prompt_token_ids,
            token_ids=ids,
            logprobs=drawn.logprobs,
            policy_version=drawn.policy_version,
            tokens_used=len(drawn.prompt_token_ids) + len(ids),
        )

    async def generate(self, messages: Sequence[Message], *, purpose: str) -> PolicyReply:
        """Answer one conversation, batched with whatever other sessions ask at the same time."""
        prompt, start = self.guided_prompt(messages)
        return _started(await self._batcher.submit(prompt), start)

    @property
    def batches(self) -> int:
        """Batches sampled through `generate` so far."""
        return self._batcher.batches


def _started(reply: PolicyReply, start: str) -> PolicyReply:
    """`reply` with its text preceded by the `start` a guide imposed (those tokens sit in the prompt)."""
    return reply.model_copy(update={"text": start + reply.text}) if start else reply


def stop_ids_of(model: Any, tokenizer: Any) -> frozenset[int]:
    """Ids that end a reply: the tokenizer's eos and whatever the model's generation config adds."""
    ids = {int(tokenizer.eos_token_id)}
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, list):
        ids.update(int(i) for i in extra)
    return frozenset(ids)


class Batcher(Generic[X, Y]):
    """Gathers single requests into batches for a blocking batch function run in a worker thread.

    A batch starts once `max_batch` requests wait, or once no new request has arrived for `gather_ms`
    (requests of concurrent sessions trickle in as their tool calls finish), and at the latest
    `10 x gather_ms` after its first request. Requests arriving while a batch runs form the next one.
    """

    def __init__(self, run: Callable[[list[X]], list[Y]], max_batch: int, gather_ms: float) -> None:
        self._run = run
        self._max_batch = max_batch
        self._gather_s = gather_ms / 1000.0
        self._pending: list[tuple[X, asyncio.Future[Y]]] = []
        self._arrived = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self.batches = 0
        self.sizes: list[int] = []
        """Size of every batch run, in order."""

    async def submit(self, item: X) -> Y:
        """The answer to `item`, computed in some batch."""
        future: asyncio.Future[Y] = asyncio.get_running_loop().create_future()
        if self._worker is None or self._worker.done():  # (a new event loop, too, starts a new worker)
            self._arrived = asyncio.Event()
            self._worker = asyncio.create_task(self._drain())
        self._pending.append((item, future))
        self._arrived.set()
        return await future

    async def _gather(self) -> None:
        """Wait for a full batch, a quiet `gather_ms`, or `10 x gather_ms` in all."""
        deadline = time.monotonic() + 10 * self._gather_s
        while len(self._pending) < self._max_batch and (left := deadline - time.monotonic()) > 0:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), min(self._gather_s, left))
            except TimeoutError:
                return

    async def _drain(self) -> None:
        while self._pending:
            await self._gather()
            batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch :]
            live = [(x, f) for x, f in batch if not f.cancelled()]
            if not live:
                continue
            self.batches += 1
            self.sizes.append(len(live))
            try:
                answers = await asyncio.to_thread(self._run, [x for x, _ in live])
            except Exception as exc:  # every waiter learns why its batch failed
                for _, f in live:
                    if not f.done():
                        f.set_exception(exc if isinstance(exc, PolicyError) else PolicyError(str(exc)))
                continue
            for (_, f), answer in zip(live, answers, strict=True):
                if not f.done():
                    f.set_result(answer)


__all__ = [
    "ACTION_INSTRUCTIONS",
    "Batcher",
    "BatchingConfig",
    "HFPolicy",
    "LoRAConfig",
    "SamplingConfig",
    "brief_schema",
    "final_action",
    "parse_final",
    "signature",
    "stop_ids_of",
    "system_prompt",
    "tool_action",
    "tool_message",
    "with_lora",
]
