"""The simulated-domain base classes over a toy domain: splits from the config, skills over the state."""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sessionrl.envs import Split, Task
from sessionrl.envs.simulated import DomainConfig, SimulatedEnv, SimulatedEpisode
from sessionrl.skills import SystemClock

Json = dict[str, Any]

CONTRACT = """name: {name}
description: A toy skill.
input_schema:
  type: object
  properties:
    entry: {{type: object}}
simulation: {{mean_ms: 50, std_ms: 10, fail_rate: 0.5}}
"""


@dataclass
class Tally:
    """A toy episode state: the entries added, flagged when an entry's `n` exceeds 10."""

    entries: list[Json] = field(default_factory=list)
    risk_flags: list[str] = field(default_factory=list)
    calls: list[tuple[str, Json, Json]] = field(default_factory=list)

    def mask(self) -> dict[str, bool]:
        return {"tally_add": True, "tally_zero": bool(self.entries)}

    def state_hash(self) -> str:
        return repr(self.entries)


def tally_add(tally: Tally, entry: Json) -> Json:
    tally.entries.append(entry)
    if entry["n"] > 10:
        tally.risk_flags.append("big")
    return {"count": len(tally.entries), "entry": entry}


def tally_zero(tally: Tally) -> Json:
    tally.entries.clear()
    return {"count": 0}


def generate(seed: int, split: Split, size: int) -> tuple[Task, ...]:
    return tuple(Task(f"tally-{split.value}-{i}", split, f"seed {seed}") for i in range(size))


@pytest.fixture
def contracts_dir(tmp_path: Path) -> Path:
    # File order (a, b) differs from name order (tally_add, tally_zero), so sorting by name shows.
    (tmp_path / "a.yaml").write_text(CONTRACT.format(name="tally_zero"))
    (tmp_path / "b.yaml").write_text(CONTRACT.format(name="tally_add"))
    return tmp_path


def open_episode(env: SimulatedEnv) -> tuple[SimulatedEpisode[Tally], Tally]:
    tally = Tally()
    tools = {"tally_add": tally_add, "tally_zero": tally_zero}
    task = env.tasks(Split.TRAIN)[0]
    return SimulatedEpisode(env.contracts(), task, tally, tools, seed=0, faults=None), tally


def test_env_generates_each_split_with_the_config_seed_and_size(contracts_dir: Path) -> None:
    config = DomainConfig(seed=5, train=3, dev=1, test=0)
    env = SimulatedEnv(config, contracts_dir=contracts_dir, generate=generate)
    assert env.config is config
    assert [len(env.tasks(split)) for split in Split] == [3, 1, 0]
    assert [task.task_id for task in env.tasks(Split.DEV)] == ["tally-dev-0"]
    assert env.tasks(Split.TRAIN)[0].instruction == "seed 5"


def test_env_scales_contracts_by_the_config_and_sorts_them(contracts_dir: Path) -> None:
    env = SimulatedEnv(DomainConfig(time_factor=0.5), contracts_dir=contracts_dir, generate=generate)
    assert env.config == DomainConfig(time_factor=0.5)
    assert [contract.name for contract in env.contracts()] == ["tally_add", "tally_zero"]
    profile = env.contracts()[0].simulation
    assert profile is not None
    # 50 ms * 0.5 and 10 ms * 0.5; transient failures are off by default, so the 0.5 rate becomes 0.
    assert (profile.mean_ms, profile.std_ms, profile.fail_rate) == (25.0, 5.0, 0.0)


def test_env_without_config_uses_the_default(contracts_dir: Path) -> None:
    env = SimulatedEnv(None, contracts_dir=contracts_dir, generate=generate)
    assert env.config == DomainConfig()
    assert len(env.tasks(Split.TEST)) == DomainConfig().test


async def test_a_skill_runs_its_tool_on_the_state_and_logs_copies(contracts_dir: Path) -> None:
    env = SimulatedEnv(DomainConfig(time_factor=0.0), contracts_dir=contracts_dir, generate=generate)
    episode, tally = open_episode(env)
    skills = {skill.name: skill for skill in episode.skills()}
    assert list(skills) == ["tally_add", "tally_zero"]
    params: Json = {"entry": {"n": 3}}
    output = await skills["tally_add"].invoke(params, SystemClock())
    assert output == {"count": 1, "entry": {"n": 3}}
    # Neither the caller's parameters nor the returned output are the objects the state keeps.
    params["entry"]["n"] = 99
    output["entry"]["n"] = 98
    assert tally.entries == [{"n": 3}]
    assert tally.calls == [("tally_add", {"entry": {"n": 3}}, {"count": 1, "entry": {"n": 3}})]


async def test_episode_reads_flags_mask_and_hash_from_its_state(contracts_dir: Path) -> None:
    env = SimulatedEnv(DomainConfig(time_factor=0.0), contracts_dir=contracts_dir, generate=generate)
    episode, _ = open_episode(env)
    assert episode.task == env.tasks(Split.TRAIN)[0]
    assert episode.action_mask() == {"tally_add": True, "tally_zero": False}
    add = next(skill for skill in episode.skills() if skill.name == "tally_add")
    await add.invoke({"entry": {"n": 11}}, SystemClock())
    assert episode.risk_flags == ("big",)
    assert episode.action_mask() == {"tally_add": True, "tally_zero": True}
    assert episode.state_hash() == "[{'n': 11}]"


def test_an_episode_is_freed_without_the_garbage_collector(contracts_dir: Path) -> None:
    # Its skills hold the state, not the episode: no reference cycle keeps a finished episode alive.
    env = SimulatedEnv(DomainConfig(time_factor=0.0), contracts_dir=contracts_dir, generate=generate)
    episode, _ = open_episode(env)
    ref = weakref.ref(episode)
    gc.disable()
    try:
        del episode
        assert ref() is None
    finally:
        gc.enable()
