"""Run configs: the shipped examples validate, mistakes name their field, each trainer gets the sections it
reads, the retail data path resolves."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sessionrl.envs.base import Split
from sessionrl.envs.retail import DATA_ENV_VAR
from sessionrl.envs.taubench import DataMissing
from sessionrl.train.config import EnvSection, RunConfig, Trainer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_examples_validate_and_round_trip(path: Path, tmp_path: Path) -> None:
    config = RunConfig.load(path)
    if config.cluster.ray is not None:  # named for how it runs, not for what it trains
        assert path.stem == "cluster"
    else:
        assert path.stem.startswith(config.env.name)
        if path.stem.endswith("-vllm"):  # the engine it samples on: a vLLM server
            assert config.model.vllm is not None
        trained = path.stem.removeprefix(f"{config.env.name}-").removesuffix("-vllm").removesuffix("-small")
        model = str(config.model.gguf or config.model.path or "").lower()  # or the pretrained model it runs
        staged = trained == "stages" and config.stages is not None  # or the stages it runs
        # or the model, then the trainer or the last stage it runs (a recipe's stage: orders-smollm2-rft)
        last = [str(config.trainer), *(config.stages or ())[-1:]]
        recipe = any(trained.removesuffix(f"-{name}") in model for name in last)
        assert trained in (config.trainer, config.env.name) or trained in model or staged or recipe
    copy = tmp_path / "again.yaml"
    copy.write_text(config.dump())
    assert RunConfig.load(copy) == config


def test_every_trainer_has_an_example() -> None:
    trainers = {RunConfig.load(path).trainer for path in EXAMPLES.glob("*.yaml")}
    assert trainers == set(Trainer)


def test_the_default_trainer_is_grpo_so_older_configs_run_as_before() -> None:
    assert RunConfig().trainer is Trainer.GRPO
    assert RunConfig.model_validate({"sft": {"demos": 3}, "rl": {"iterations": 1}}).trainer is Trainer.GRPO


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"trainer": "ppo"}, r"trainer ppo needs a `ppo:` section"),
        ({"trainer": "dpo"}, r"trainer dpo needs a `dpo:` section"),
        ({"trainer": "aaac", "ppo": {}}, r"trainer aaac needs a `aaac:` section"),
        ({"trainer": "ppo", "ppo": {}, "rl": {}}, r"trainer ppo does not read `rl:`"),
        ({"trainer": "sft", "rl": {"iterations": 3}}, r"trainer sft does not read `rl:`"),
        ({"ppo": {}}, r"trainer grpo does not read `ppo:`"),
        ({"trainer": "ppo", "seed": 1, "ppo": {"trainer": {"run": {"seed": 2}}}}, "top-level `seed:`"),
        ({"trainer": "ppo", "ppo": {"trainer": {"update": {"lr": 0}}}}, "lr > 0"),
        ({"trainer": "ppo", "ppo": {"trainer": {"gae_lamda": 0.9}}}, "gae_lamda"),
        ({"trainer": "rlhf"}, "trainer"),
    ],
)
def test_a_trainer_gets_the_sections_it_reads_and_no_other(data: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        RunConfig.model_validate(data)


def test_the_dump_keeps_only_the_trainer_sections_read() -> None:
    dumped = RunConfig.model_validate({"trainer": "ppo", "ppo": {}}).dump()
    assert "ppo:" in dumped
    assert not {"sft:", "rl:", "dpo:", "aaac:"} & set(dumped.split())


def test_mistakes_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rl:\n  trainer:\n    group_size: 1\n")
    with pytest.raises(ValidationError, match="group_size >= 2"):
        RunConfig.load(bad)
    bad.write_text("sft:\n  demo: 3\n")
    with pytest.raises(ValidationError, match=r"sft\.demo"):
        RunConfig.load(bad)
    bad.write_text("rl:\n  sampling: {temperature: 0.5}\n")
    with pytest.raises(ValidationError, match="temperature must be equal"):
        RunConfig.load(bad)


def test_retail_data_comes_from_the_config_or_the_environment(
    retail_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DATA_ENV_VAR, raising=False)
    with pytest.raises(DataMissing, match=DATA_ENV_VAR):
        EnvSection(name="retail").build()
    assert len(EnvSection(name="retail", data=retail_data).build().tasks(Split.TEST)) == 115
    monkeypatch.setenv(DATA_ENV_VAR, str(retail_data))
    assert EnvSection(name="retail").build().name == "retail"


def test_env_options_beside_the_name_are_read_as_options() -> None:
    flat = EnvSection.model_validate({"name": "orders", "train": 6, "dev": 2})
    nested = EnvSection.model_validate({"name": "orders", "options": {"train": 6, "dev": 2}})
    assert flat == nested
    assert flat.options == {"train": 6, "dev": 2}
    env = flat.build()
    assert (len(env.tasks(Split.TRAIN)), len(env.tasks(Split.DEV))) == (6, 2)
    with pytest.raises(ValidationError, match="both beside name and under options"):
        EnvSection.model_validate({"name": "orders", "train": 6, "options": {"train": 7}})


def test_env_names_and_options_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: {name: orders, data: somewhere}\n")
    with pytest.raises(ValidationError, match=r"takes no option 'data'; it accepts: seed, train, dev, test"):
        RunConfig.load(bad)
    bad.write_text("env: {name: order}\n")
    with pytest.raises(ValidationError, match=r"no env named 'order'; known: clinic, orders, retail"):
        RunConfig.load(bad)
    bad.write_text("env: {name: orders, options: {train: many}}\n")
    with pytest.raises(ValidationError, match=r"train: Input should be a valid integer"):
        RunConfig.load(bad)


def test_env_by_module_and_class() -> None:
    section = EnvSection(name="sessionrl.envs.orders:OrdersEnv")
    assert section.build().name == "orders"
