"""Run configs: the shipped examples validate, mistakes name their field, the retail data path resolves."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sessionrl.envs.base import Split
from sessionrl.train.config import RETAIL_DATA_ENV, EnvSection, RunConfig

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
    monkeypatch.delenv(RETAIL_DATA_ENV, raising=False)
    with pytest.raises(ValueError, match=RETAIL_DATA_ENV):
        EnvSection(name="retail").build()
    assert len(EnvSection(name="retail", data=retail_data).build().tasks(Split.TEST)) == 115
    monkeypatch.setenv(RETAIL_DATA_ENV, str(retail_data))
    assert EnvSection(name="retail").build().name == "retail"
