"""Run configs: the shipped examples validate, mistakes name their field, the retail data path resolves."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sessionrl.envs.base import Split
from sessionrl.envs.retail import DATA_ENV_VAR
from sessionrl.envs.taubench import DataMissing
from sessionrl.train.config import EnvSection, RunConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["orders.yaml", "retail.yaml"])
def test_shipped_examples_validate_and_round_trip(name: str, tmp_path: Path) -> None:
    config = RunConfig.load(EXAMPLES / name)
    assert config.env.name == name.removesuffix(".yaml")
    copy = tmp_path / "again.yaml"
    copy.write_text(config.dump())
    assert RunConfig.load(copy) == config


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
