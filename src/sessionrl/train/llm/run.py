"""The parts of a training run, built once and handed to the stages: environment, store, shaper, policy,
metrics log. Everything lives under the run folder::

    config.yaml          the validated config
    sessions.db          the session store (every demonstration, rollout and evaluation session),
                         unless `cluster.store` names a shared one
    reward_stats.json    the reward shaper's running layer statistics
    base/                the initial policy (the tiny model and its tokenizer, when built here)
    sft_policy/          the policy after imitation; rl_policy/ after reinforcement learning
    checkpoint/          the latest checkpoint (see `sessionrl.train.llm.checkpoint`)
    metrics.jsonl, tb/   one JSON line per logged step, and the same scalars for TensorBoard
"""

from __future__ import annotations

import copy
import resource
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import orjson
import torch
from tokenizers import pre_tokenizers

from sessionrl.envs.base import DecisionEnv, Split
from sessionrl.episodes.llm import prompt_messages
from sessionrl.policy.llm import HFPolicy, SamplingConfig, final_action, tool_action, with_lora
from sessionrl.policy.tiny import build_tiny_policy
from sessionrl.policy.toolcalls import ToolFormat
from sessionrl.policy.vllm import VLLMEngine
from sessionrl.rewards.engine import RewardEngine
from sessionrl.session.model import Session
from sessionrl.store import SessionStore
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.checkpoint import LoopState
from sessionrl.train.llm.data import call_message
from sessionrl.train.llm.feed import RewardShaper
from sessionrl.train.threads import pin_threads


def max_rss_mb() -> float:
    """The most memory this process has held resident so far, in MiB (the kernel's high-water mark)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1)


class MetricsLog:
    """Scalars to a JSON-lines file and to TensorBoard, under one tag per stage. Every record also carries
    `max_rss_mb`, the process's resident high-water mark when it was written, so the stage that raised a
    run's memory can be read back from the log."""

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = SummaryWriter(str(folder / "tb"))

    def write(self, stage: str, step: int, values: Mapping[str, Any]) -> None:
        """Append one record; numeric values also go to TensorBoard as `<stage>/<name>`."""
        record = {"stage": stage, "step": step, "time": time.time(), "max_rss_mb": max_rss_mb(), **values}
        self._file.write(orjson.dumps(record).decode() + "\n")
        self._file.flush()
        for name, value in values.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._tb.add_scalar(f"{stage}/{name}", value, step)

    def rewind(self, until: float) -> int:
        """Drop the records written after `until` (a `time.time()`) and return how many: a run resumed
        from a checkpoint made at `until` logs that work again, so each step keeps one record."""
        self._file.close()
        lines = [line for line in self.path.read_bytes().splitlines() if line.strip()]
        kept = [line for line in lines if orjson.loads(line)["time"] <= until]
        self.path.write_bytes(b"".join(line + b"\n" for line in kept))
        self._file = self.path.open("a", encoding="utf-8")
        return len(lines) - len(kept)

    def close(self) -> None:
        """Flush and close both sinks."""
        self._file.close()
        self._tb.close()


@dataclass
class Run:
    """A training run's parts. `state` is the loop state the stages advance and checkpoints save."""

    config: RunConfig
    env: DecisionEnv
    store: SessionStore
    shaper: RewardShaper
    log: MetricsLog
    state: LoopState
    policy: HFPolicy | None = None

    @property
    def folder(self) -> Path:
        """The run folder."""
        return self.config.run_dir

    @property
    def system(self) -> str:
        """The system prompt every episode of this run starts with (in the policy's tool-call format; the
        action language before the policy exists, as a tiny model speaks it)."""
        return self.system_in(self.policy.tool_format if self.policy is not None else ToolFormat.ACTION)

    def system_in(self, fmt: ToolFormat) -> str:
        """The run's system prompt for a policy that writes tool calls as `fmt` does."""
        some_task = self.env.tasks(Split.TRAIN)[0]
        return prompt_messages(self.env, some_task, self.config.rollout, fmt)[0].content

    @property
    def generators(self) -> dict[str, torch.Generator]:
        """The random generators a checkpoint keeps: the sampler's, once a policy is built."""
        return {"sampling": self.policy.generator} if self.policy is not None else {}

    def need_policy(self) -> HFPolicy:
        """The policy (built by the imitation stage, or loaded on resume)."""
        if self.policy is None:
            raise RuntimeError("the run has no policy yet")
        return self.policy

    def close(self) -> None:
        """Close the store and the metrics log."""
        self.store.close()
        self.log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


def open_run(config: RunConfig) -> Run:
    """Create (or reopen) the run folder and its parts; the loop state starts fresh. Sets torch's thread
    count to the one it has (`pin_threads`): a run is reproducible only once it is set."""
    pin_threads()
    folder = config.run_dir
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(config.dump(), encoding="utf-8")
    store = SessionStore.open(config.store_url)
    rewards = config.rewards
    if rewards.stats_path is None:
        rewards = rewards.model_copy(update={"stats_path": folder / "reward_stats.json"})
    engine = RewardEngine(rewards)
    return Run(
        config=config,
        env=config.env.build(),
        store=store,
        shaper=RewardShaper(engine, store),
        log=MetricsLog(folder),
        state=LoopState(),
    )


def tokenizer_corpus(
    env: DecisionEnv, system: str, demos: Sequence[Session], max_tool_chars: int
) -> list[str]:
    """Texts a tiny model's tokenizer learns from: the system prompt, every training request, and the
    demonstrations' actions, tool messages and answers."""
    texts = [system, *(task.instruction for task in env.tasks(Split.TRAIN))]
    for session in demos:
        texts += [tool_action(c.tool, c.params) for c in session.tool_calls]
        texts += [call_message(c, max_tool_chars).content for c in session.tool_calls]
        if session.final_output is not None:
            texts.append(final_action(session.final_output.text))
    return texts


def split_digits(tokenizer: Any) -> None:
    """Make `tokenizer` cut every digit into its own token (before its other pre-tokenisation).

    Byte-level BPE otherwise merges runs of digits into tokens that depend on their neighbours: the
    phone ``19993376103`` is one token after a space and another inside JSON quotes, and an id never seen
    in training has no token of its own. A small model can only learn to copy ids from a request into a
    tool call when both read as the same digit tokens.
    """
    backend = tokenizer.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), backend.pre_tokenizer]
    )


def build_policy(config: RunConfig, texts: Iterable[str], folder: Path) -> HFPolicy:
    """The run's policy: the configured checkpoint (or GGUF file), or a tiny model built on `texts` and
    saved to `folder`; with LoRA adapters when configured. Samples as `config.rl.sampling` says."""
    sampling = config.rl.sampling
    checkpoint = config.model.checkpoint()
    if checkpoint is not None:
        policy = HFPolicy.load(checkpoint, sampling, config.batching)
    else:
        model, tokenizer = build_tiny_policy(texts, config.model.tiny, folder)
        split_digits(tokenizer)
        tokenizer.save_pretrained(folder)
        policy = HFPolicy(model, tokenizer, sampling, config.batching)
    if config.model.lora is not None:
        torch.manual_seed(config.seed)  # the adapters' initialisation follows the seed, not what ran before
        policy.model = with_lora(policy.model, config.model.lora)
    if config.model.vllm is not None:
        policy.use(VLLMEngine(config.model.vllm, stop_ids=policy.stop_ids, version=policy.version))
    if config.model.engine == "ortgenai":
        from sessionrl.policy.ortgenai import for_policy  # the ort extra, needed only when chosen

        policy.use(for_policy(policy, checkpoint or folder, config.model.cache))
    torch.manual_seed(config.seed)
    return policy


def export_policy(policy: HFPolicy, folder: Path) -> Path:
    """Save the policy as a plain checkpoint that `HFPolicy.load` reads (LoRA adapters merged, on a copy)."""
    model = policy.model
    if hasattr(model, "merge_and_unload"):
        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    return folder


def evaluation_view(policy: HFPolicy, max_new_tokens: int, temperature: float = 0.0) -> HFPolicy:
    """The policy as evaluations and the stage gate use it: greedy (temperature 0) or sampling."""
    base = policy.sampling
    sampling = SamplingConfig(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        max_prompt_tokens=base.max_prompt_tokens,
        seed=base.seed,
    )
    return policy.view(sampling)


__all__ = [
    "MetricsLog",
    "Run",
    "build_policy",
    "evaluation_view",
    "export_policy",
    "open_run",
    "tokenizer_corpus",
]
