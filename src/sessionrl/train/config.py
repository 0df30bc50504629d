"""A training run's configuration: one YAML file, validated into frozen models (one help line per field).

```yaml
run_dir: runs/orders
trainer: grpo
env: {name: orders, test: 100}
model: {tiny: {hidden_size: 128}}
sft: {demos: 64, trainer: {steps: 60}}
rl: {iterations: 20, tasks_per_iteration: 8, trainer: {group_size: 4}}
evaluation: {tasks: 60}
```

`trainer` names what trains, and so which sections the run reads (`TRAINER_SECTIONS`): `sft` imitation
alone; `grpo` imitation, a gate, then GRPO; `dpo` imitation, then DPO on preference pairs; `rft`
imitation, then rejection-sampling fine-tuning; `ppo` and `aaac` the structured policy on the
environment's Gymnasium view. The `dpo`, `rft`, `ppo` and `aaac` sections must be written when their
trainer runs (`ppo: {}` takes PPO's defaults); `grpo` reads an `rft:` section too when one is written
(rejection sampling between the gate and GRPO), and a trainer section the trainer does not read is refused,
so a config says what it runs.

Every other section has defaults; `RunConfig.load(path)` reads the file and names the field and rule of any
mistake. The run writes everything under `run_dir`.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sessionrl.envs.base import DecisionEnv, Split
from sessionrl.envs.faults import Faults, FaultSchedule
from sessionrl.envs.registry import REGISTRY, EnvBuildError
from sessionrl.episodes.config import RolloutConfig
from sessionrl.eval.autopause import AutoPauseConfig
from sessionrl.eval.collapse import CollapseConfig
from sessionrl.eval.levels import LevelsConfig
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.policy.llm import BatchingConfig, LoRAConfig, SamplingConfig
from sessionrl.policy.sources import materialise
from sessionrl.policy.tiny import TinyModelConfig
from sessionrl.policy.vllm import VLLMSettings
from sessionrl.rewards.engine import RewardConfig
from sessionrl.train.llm.dpo import DPOConfig
from sessionrl.train.llm.grpo import GRPOConfig
from sessionrl.train.llm.sft import SFTConfig
from sessionrl.train.structured.aaac import AAACConfig
from sessionrl.train.structured.imitation import ImitationConfig
from sessionrl.train.structured.ppo import PPOConfig


class Section(BaseModel):
    """Base of every section: frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


DEV_TOOL_ACCURACY = (
    "Judge on per-turn tool accuracy too, with `dev_tasks`: kept weights must also get at least as many of "
    "those tasks' gold turns exactly right (right tool, exact arguments) as the weights kept before. Tasks "
    "solved are few and move by luck; the turns, about four a task, show whether the calls got worse."
)


def _judged_on_dev(section: RLSection | RFTSection, name: str) -> None:
    """Check that `section` (named `name`) has dev tasks for its `dev_tool_accuracy` to judge on."""
    if section.dev_tool_accuracy and not section.dev_tasks:
        raise ValueError(f"{name}.dev_tool_accuracy judges on {name}.dev_tasks dev tasks: set those too")


class EnvSection(Section):
    """Which domain to train on: an environment name and its options, checked by the env registry.

    Options may also sit beside `name` (`{name: orders, train: 400}`); they are read as `options`.
    """

    name: str = Field(
        default="orders",
        description="A registered environment (`sessionrl envs list`) or module:Class.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword options of the environment (orders: seed, train, dev, test; retail: data).",
    )

    @model_validator(mode="before")
    @classmethod
    def _options_beside_name(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        beside = {key: value for key, value in data.items() if key not in ("name", "options")}
        both = sorted(set(beside) & set(data.get("options") or {}))
        if both:
            raise ValueError(f"env option(s) {both} given both beside name and under options; keep one")
        if not beside:
            return data
        return {"name": data.get("name", "orders"), "options": {**(data.get("options") or {}), **beside}}

    @model_validator(mode="after")
    def _options_known(self) -> EnvSection:
        try:
            REGISTRY.validate(self.name, self.options)
        except EnvBuildError as error:  # an unknown name is a LookupError; pydantic reports ValueErrors
            raise ValueError(str(error)) from error
        return self

    def build(self) -> DecisionEnv:
        """The environment this section describes (`sessionrl.envs.build(name, **options)`)."""
        return REGISTRY.build(self.name, **self.options)


class ModelSection(Section):
    """The policy: a local checkpoint, a GGUF file (`sessionrl.policy.sources`), or a tiny model built from
    the environment's texts."""

    path: Path | None = Field(default=None, description="Local Hugging Face checkpoint; none: build tiny.")
    gguf: str | None = Field(
        default=None,
        description="A GGUF file, by path or as package:resource, converted once into `cache`.",
    )
    cache: Path | None = Field(
        default=None,
        description="Where converted GGUF files are kept; none: $SESSIONRL_MODEL_CACHE or ~/.cache.",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Shape of the tiny model.")
    lora: LoRAConfig | None = Field(default=None, description="LoRA on the top blocks; none: full tuning.")
    vllm: VLLMSettings | None = Field(
        default=None,
        description="Sample through this vLLM server, its weights refreshed by LoRA hot-loading (needs "
        "`lora`); none: the torch engine in this process.",
    )
    engine: Literal["torch", "ortgenai"] = Field(
        default="torch",
        description="The CPU engine without `vllm`: torch (our sampler over the trained module) or ortgenai "
        "(onnxruntime-genai over the checkpoint converted once, LoRA hot-loaded; needs `lora` and the ort "
        "extra); docs/engines.md compares them.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if self.path is not None and self.gguf is not None:
            raise ValueError("model: give `path` (a checkpoint folder) or `gguf` (a GGUF file), not both")
        if self.vllm is not None and self.lora is None:
            raise ValueError("model.vllm needs model.lora: vLLM takes the trained weights as LoRA adapters")
        if self.engine == "ortgenai" and (self.lora is None or self.vllm is not None):
            raise ValueError("model.engine: ortgenai needs model.lora (its refresh) and no model.vllm")
        return self

    def checkpoint(self) -> Path | None:
        """The checkpoint folder to load (a GGUF file converted on first use); None: build the tiny model."""
        if self.gguf is not None:
            return materialise(self.gguf, self.cache)
        return self.path


class FaultSection(Section):
    """Injected faults: a rate that decays over RL iterations, and a fixed rate for evaluation."""

    schedule: FaultSchedule = Field(default_factory=lambda: FaultSchedule(start=0.1, end=0.1, steps=1))
    eval_rate: float = Field(default=0.1, ge=0, le=1, description="Tool-fault rate during evaluation.")
    demo_rate: float = Field(default=0.0, ge=0, le=1, description="Tool-fault rate of expert demos.")

    garbled: bool = Field(default=True, description="Also garble outputs (effects kept) at the same rate.")

    def at(self, iteration: int) -> Faults:
        """Tool faults for one RL iteration."""
        return self.fixed(self.schedule.rate(iteration))

    def fixed(self, rate: float) -> Faults:
        """Tool faults at a fixed rate: failed calls, and garbled outputs when `garbled`."""
        return Faults(tool_error=rate, garbled_output=rate if self.garbled else 0.0)


class CapturedSource(Section):
    """Captured sessions to imitate instead of recorded expert ones (`sft.data: store`)."""

    db: str = Field(description="The session store holding them (a URL such as sqlite:///runs/sessions.db).")
    filters: dict[str, Any] = Field(
        default_factory=dict, description="Typed filters of `sessions query`, such as {tags: [gateway]}."
    )
    limit: int = Field(default=10_000, ge=1, description="Most sessions read.")


class SFTSection(Section):
    """The imitation stage."""

    data: Literal["expert", "store"] = Field(
        default="expert", description="expert: record expert demonstrations; store: captured sessions."
    )
    store: CapturedSource | None = Field(default=None, description="Where captured sessions come from.")
    demos: int = Field(default=64, ge=1, description="Expert sessions recorded on training tasks.")
    trainer: SFTConfig = Field(default_factory=SFTConfig, description="Imitation trainer settings.")

    @model_validator(mode="after")
    def _store_named(self) -> SFTSection:
        if (self.data == "store") != (self.store is not None):
            raise ValueError("`data: store` and a `store:` source go together ({db: ..., filters: {...}})")
        return self


class RLSection(Section):
    """The reinforcement-learning stage."""

    iterations: int = Field(default=20, ge=0, description="Rollout-reward-update iterations at most.")
    minutes: float | None = Field(default=None, gt=0, description="Stop the stage after this long.")
    tasks_per_iteration: int = Field(default=8, ge=1, description="Training tasks per iteration.")
    unseen_tasks: bool = Field(
        default=False,
        description="Draw RL tasks only from training tasks past the first `sft.demos` (none imitated).",
    )
    curriculum: bool = Field(
        default=False,
        description="Draw RL tasks by capability level: those up to one level above what rollouts reached.",
    )
    max_lag: int = Field(default=2, ge=0, description="Oldest policy version (behind) a session may be.")
    late_share: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Share of RL sessions whose verdict reaches the reward shaper `late_after` iterations "
        "late, as annotators' outcomes do (a simulation; 0: none).",
    )
    late_after: int = Field(default=2, ge=1, description="Iterations a late session's verdict waits.")
    dev_tasks: int = Field(
        default=0,
        ge=0,
        description="Dev tasks that judge the stage (0: none), as `rft.dev_tasks` judges the rounds: the "
        "policy is evaluated greedily on them before the first iteration, every `dev_every` iterations, "
        "and after the last; weights that solve fewer of them than the kept ones are undone (the kept "
        "weights come back, with a fresh optimiser), so RL never ends below the policy it started from on "
        "validation.",
    )
    dev_every: int = Field(
        default=0,
        ge=0,
        description="Iterations between dev judgements with `dev_tasks` (0: only after the last).",
    )
    dev_tool_accuracy: bool = Field(default=False, description=DEV_TOOL_ACCURACY)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="How rollouts sample.")
    trainer: GRPOConfig = Field(default_factory=GRPOConfig, description="GRPO trainer settings.")
    collapse: CollapseConfig = Field(
        default_factory=CollapseConfig,
        description="Stop RL, rolled back to the last healthy policy, when it collapses (on by default).",
    )

    @model_validator(mode="after")
    def _same_temperature(self) -> RLSection:
        if self.sampling.temperature != self.trainer.temperature:
            raise ValueError("rl.sampling.temperature and rl.trainer.temperature must be equal")
        return self

    @model_validator(mode="after")
    def _dev_every_needs_dev_tasks(self) -> RLSection:
        if self.dev_every and not self.dev_tasks:
            raise ValueError("rl.dev_every judges on rl.dev_tasks dev tasks: set rl.dev_tasks too")
        _judged_on_dev(self, "rl")
        return self


class EvalSection(Section):
    """Evaluation: the gate between stages, and the final report."""

    split: Split = Field(default=Split.TEST, description="Split of the final report.")
    tasks: int = Field(default=60, ge=1, description="Tasks of the final report (at most the split's size).")
    gate_split: Split = Field(default=Split.DEV, description="Split of the gate after imitation.")
    gate_tasks: int = Field(default=20, ge=1, description="Tasks of the gate.")
    gate_min_success: float = Field(default=0.0, ge=0, le=1, description="RL starts only at this success.")
    max_new_tokens: int = Field(default=96, ge=1, description="Longest reply in evaluation.")
    temperature: float = Field(
        default=0.0, ge=0, description="Sampling temperature of evaluation episodes (0: greedy)."
    )


class DPOSection(Section):
    """DPO after imitation, on preference pairs from sampled episodes (`sessionrl.train.llm.preferences`)."""

    tasks: int = Field(default=32, ge=1, description="Demonstrated training tasks sampled for pairs.")
    episodes_per_task: int = Field(default=4, ge=1, description="Imitation-policy episodes per task.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="How those episodes sample.")
    trainer: DPOConfig = Field(default_factory=DPOConfig, description="DPO trainer settings.")


class RFTSection(Section):
    """Rejection-sampling fine-tuning after imitation (`sessionrl.train.llm.rft`): sample, keep what the
    judge accepts, imitate it."""

    rounds: int = Field(default=1, ge=1, description="Rounds of sampling, judging and training.")
    tasks: int = Field(default=32, ge=1, description="Training tasks drawn for each round.")
    samples: int = Field(default=4, ge=1, description="Episodes sampled per task (K).")
    min_kept: int = Field(
        default=8,
        ge=1,
        description="A round that keeps fewer distinct episodes trains on none: a few episodes imitated "
        "for many steps are learned by rote (one kept of 16 took SmolLM2's parse rate from 0.97 to 0.38), "
        "and copies of one episode, which a nearly deterministic policy samples, count once.",
    )
    dev_tasks: int = Field(
        default=0,
        ge=0,
        description="Dev tasks that judge each round (0: none). The policy is evaluated greedily on them "
        "before the first round and after each round that trained; a round after which it solves fewer of "
        "them than the weights it started from is undone (those weights come back), so the rounds never "
        "end on a policy that validation found worse than imitation's.",
    )
    dev_tool_accuracy: bool = Field(default=False, description=DEV_TOOL_ACCURACY)
    replay: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Share of each batch of a round's imitation drawn from the demonstrations imitation "
        "learned from (the `sft.demos` expert episodes; 0: the kept episodes only). The kept episodes are "
        "the policy's own, from the states it reaches; replayed demonstrations keep it answering well where "
        "the expert's episodes go too. A stage that starts from an exported policy records them again: give "
        "it imitation's `sft.demos`.",
    )
    accept: Literal["task", "dense", "clean"] = Field(
        default="task",
        description="task: keep episodes the environment judged solved; dense: keep those that answered "
        "and where no reward term charged any step; clean: both.",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="How episodes sample.")
    trainer: SFTConfig = Field(
        default_factory=SFTConfig, description="Imitation settings for the kept episodes (each round)."
    )

    @model_validator(mode="after")
    def _tool_accuracy_needs_dev_tasks(self) -> RFTSection:
        _judged_on_dev(self, "rft")
        return self


class ReflectionSection(Section):
    """The third stage (`stages: [imitation, rl, reflection]`): reflect on failures, retry with the
    reflection in context, train on the corrected retries (`sessionrl.train.llm.reflection`)."""

    tasks: int = Field(default=32, ge=1, description="Training tasks the RL policy attempts for failures.")
    held_out: int = Field(default=30, ge=1, description="Report-split tasks whose failures measure CU.")
    trainer: SFTConfig = Field(default_factory=SFTConfig, description="SFT on corrected retries.")
    root_cause_weight: tuple[float, float] = Field(
        default=(0.1, 0.2), description="Weight of the root-cause prediction loss (L5), first to last step."
    )
    reflector: Literal["judge", "policy"] = Field(
        default="judge",
        description="Who writes the reflection a held-out retry reads: the judge's offline extractor, or "
        "the policy itself (it names the root cause; the plan is the cause's generic one).",
    )


Stage = Literal["imitation", "rl", "reflection"]
STAGE_ORDER: tuple[Stage, ...] = ("imitation", "rl", "reflection")


class StructuredSection(Section):
    """A structured trainer: imitation of the expert's plans, then the trainer's rounds."""

    imitation: ImitationConfig | None = Field(
        default_factory=ImitationConfig, description="Behaviour cloning first; null: start from scratch."
    )


class PPOSection(StructuredSection):
    """PPO on the environment's Gymnasium view."""

    trainer: PPOConfig = Field(default_factory=PPOConfig, description="Run shape, update, GAE λ.")


class AAACSection(StructuredSection):
    """AAAC on the environment's Gymnasium view."""

    trainer: AAACConfig = Field(default_factory=AAACConfig, description="Run shape, update, λ and KL.")


class RaySection(Section):
    """RL episodes on Ray actors (`sessionrl.cluster.ray_rollout`; needs the `cluster` extra)."""

    address: str | None = Field(
        default=None, description="Ray cluster to join (`auto`, `ray://head:10001`); none: start one here."
    )
    workers: int = Field(
        default=2, ge=1, description="Rollout actors, each with the env and a policy replica."
    )
    cpus_per_worker: float = Field(default=1.0, gt=0, description="CPUs Ray reserves for each worker.")
    episodes_per_request: int = Field(
        default=4, ge=1, description="Episodes handed to a worker at once (handed out again if it dies)."
    )
    publish_every: int = Field(
        default=1, ge=1, description="Policy versions between weight broadcasts (at most rl.max_lag + 1)."
    )
    max_replacements: int = Field(
        default=8, ge=0, description="Dead workers replaced within one rollout before the run stops."
    )


class ClusterSection(Section):
    """Where the run's sessions live and its episodes run, past one process."""

    store: str | None = Field(
        default=None,
        description="Store URL the trainer and its workers share (postgresql://...); none: one in run_dir.",
    )
    ray: RaySection | None = Field(default=None, description="Rollout workers on Ray; none: in-process.")


class Trainer(StrEnum):
    """What a run trains (see the module doc)."""

    SFT = "sft"
    GRPO = "grpo"
    DPO = "dpo"
    RFT = "rft"
    PPO = "ppo"
    AAAC = "aaac"


EXPORTED = {Trainer.SFT: "sft", Trainer.GRPO: "rl", Trainer.DPO: "dpo", Trainer.RFT: "rft"}
"""The label of the policy each LLM trainer exports last, to `<label>_policy/` in the run folder: after
imitation, after GRPO, after DPO, after rejection-sampling fine-tuning."""


TRAINER_SECTIONS: dict[Trainer, frozenset[str]] = {
    Trainer.SFT: frozenset({"sft"}),
    Trainer.GRPO: frozenset({"sft", "rl", "rft"}),
    Trainer.DPO: frozenset({"sft", "dpo"}),
    Trainer.RFT: frozenset({"sft", "rft"}),
    Trainer.PPO: frozenset({"ppo"}),
    Trainer.AAAC: frozenset({"aaac"}),
}
"""The trainer sections each trainer reads; the others must be left out."""

ALL_TRAINER_SECTIONS = frozenset().union(*TRAINER_SECTIONS.values())
"""Every trainer section."""

OWN_SECTIONS = frozenset({"dpo", "rft", "ppo", "aaac"})
"""Trainer sections without a default: the trainer they belong to needs them written."""

OPTIONAL_SECTIONS: dict[Trainer, frozenset[str]] = {Trainer.GRPO: frozenset({"rft"})}
"""Sections of `OWN_SECTIONS` a trainer reads only when written: GRPO's rejection-sampling warm start."""


class RunConfig(Section):
    """A whole run: environment, model, episodes, stages, evaluation."""

    run_dir: Path = Field(default=Path("runs/train"), description="Where everything is written.")
    seed: int = Field(default=0, description="Seeds task draws, sampling and initialisation.")
    trainer: Trainer = Field(
        default=Trainer.GRPO,
        description="What trains: sft, grpo, dpo, rft (LLM policy), ppo, aaac (structured).",
    )
    env: EnvSection = Field(default_factory=EnvSection)
    model: ModelSection = Field(default_factory=ModelSection)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="How episodes run.")
    orchestrator: OrchestratorConfig = Field(
        default_factory=OrchestratorConfig,
        description="The engine episodes run on (lanes, guards); scripted plans widen the plan guards.",
    )
    batching: BatchingConfig = Field(default_factory=BatchingConfig, description="Request batching.")
    faults: FaultSection = Field(default_factory=FaultSection)
    sft: SFTSection = Field(default_factory=SFTSection)
    rl: RLSection = Field(default_factory=RLSection)
    evaluation: EvalSection = Field(default_factory=EvalSection)
    rewards: RewardConfig = Field(
        default_factory=RewardConfig,
        description="How episodes are rewarded (rule file, judge); layer stats default to the run folder.",
    )
    cluster: ClusterSection = Field(default_factory=ClusterSection, description="Shared store, Ray workers.")
    dpo: DPOSection | None = Field(default=None, description="DPO settings (trainer: dpo).")
    rft: RFTSection | None = Field(
        default=None, description="Rejection sampling settings (trainer: rft; or grpo, before GRPO)."
    )
    ppo: PPOSection | None = Field(default=None, description="PPO settings (trainer: ppo).")
    aaac: AAACSection | None = Field(default=None, description="AAAC settings (trainer: aaac).")
    levels: LevelsConfig = Field(
        default_factory=LevelsConfig,
        description="Capability-level thresholds; `gate` lists what RL waits for.",
    )
    auto_pause: AutoPauseConfig | None = Field(
        default=None, description="Pause RL when a metric falls this many iterations in a row; none: never."
    )
    stages: tuple[Stage, ...] | None = Field(
        default=None, description="Staged run (trainer: grpo): [imitation, rl, reflection] adds stage 3."
    )
    reflection: ReflectionSection = Field(
        default_factory=ReflectionSection, description="The reflection stage (when `stages` names it)."
    )

    @model_validator(mode="after")
    def _sections_fit_the_trainer(self) -> RunConfig:
        reads = TRAINER_SECTIONS[self.trainer]
        for name in sorted(OWN_SECTIONS & reads - OPTIONAL_SECTIONS.get(self.trainer, frozenset())):
            if getattr(self, name) is None:
                raise ValueError(
                    f"trainer {self.trainer} needs a `{name}:` section (`{name}: {{}}` for defaults)"
                )
        written = {name for name in self.model_fields_set if getattr(self, name) is not None}
        unread = sorted((written & ALL_TRAINER_SECTIONS) - reads)
        if unread:
            raise ValueError(
                f"trainer {self.trainer} does not read {', '.join(f'`{n}:`' for n in unread)} (it reads"
                f" {', '.join(f'`{n}:`' for n in sorted(reads))}): remove those sections or change `trainer`"
            )
        if self.stages is not None and (self.stages != STAGE_ORDER[: len(self.stages)] or not self.stages):
            raise ValueError(
                f"stages must be a start of {list(STAGE_ORDER)}, in that order; got {list(self.stages)}"
            )
        if self.stages is not None and self.trainer is not Trainer.GRPO:
            raise ValueError("`stages:` runs the LLM loop: use it with `trainer: grpo`")
        structured = self.ppo or self.aaac
        if structured is not None and structured.trainer.run.seed not in (0, self.seed):
            raise ValueError("a structured run is seeded by the top-level `seed:`, not by trainer.run.seed")
        ray = self.cluster.ray
        if ray is not None and ray.publish_every - 1 > self.rl.max_lag:
            raise ValueError(
                f"cluster.ray.publish_every={ray.publish_every} lets rollouts lag {ray.publish_every - 1}"
                f" versions, past rl.max_lag={self.rl.max_lag}"
            )
        return self

    @property
    def store_url(self) -> str:
        """The run's store: `cluster.store`, or the SQLite file in the run folder."""
        return self.cluster.store or f"sqlite:///{self.run_dir.resolve() / 'sessions.db'}"

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        """Read and validate a YAML config file."""
        data: Any = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a run config is a mapping of sections")
        return cls.model_validate(data)

    def dump(self) -> str:
        """The config as YAML (what the run folder keeps next to its results)."""
        unread = ALL_TRAINER_SECTIONS - TRAINER_SECTIONS[self.trainer]
        return yaml.safe_dump(self.model_dump(mode="json", exclude=set(unread)), sort_keys=False)


__all__ = [
    "TRAINER_SECTIONS",
    "AAACSection",
    "ClusterSection",
    "DPOSection",
    "EnvSection",
    "EvalSection",
    "FaultSection",
    "ModelSection",
    "PPOSection",
    "RFTSection",
    "RLSection",
    "RaySection",
    "ReflectionSection",
    "RunConfig",
    "SFTSection",
    "StructuredSection",
    "Trainer",
]
