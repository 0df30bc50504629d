"""GRPO with its episodes on 2 Ray rollout workers, one of them killed mid-run: every episode is in the
shared store exactly once, and training goes on."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sessionrl.envs.base import Split
from sessionrl.episodes import EpisodeSpec, RolloutConfig
from sessionrl.episodes.verdict import task_success
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_model, train_tokenizer
from sessionrl.store import SessionStore
from sessionrl.train.config import (
    ClusterSection,
    EnvSection,
    EvalSection,
    ModelSection,
    RaySection,
    RLSection,
    RunConfig,
    SFTSection,
)
from sessionrl.train.llm.grpo import GRPOConfig
from sessionrl.train.llm.loop import train
from sessionrl.train.llm.sft import SFTConfig

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'sessionrl[cluster]')")
from sessionrl.cluster.ray_rollout import ABANDONED, ACTOR_PREFIX, RayRollout  # noqa: E402

ITERATIONS, TASKS, GROUP = 3, 2, 2
EPISODE = re.compile(r"(rl-\d{4}-.+-\d+)(\.\d+)?")


def ray_run(folder: Path, store: str) -> RunConfig:
    return RunConfig(
        run_dir=folder,
        env=EnvSection(train=16, dev=4, test=4),
        model=ModelSection(
            tiny=TinyModelConfig(
                vocab_size=700, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64
            )
        ),
        rollout=RolloutConfig(max_steps=3, full_schemas=False, domain_policy=False, max_tool_chars=120),
        sft=SFTSection(demos=4, trainer=SFTConfig(steps=2, batch_sessions=4, token_budget=4096)),
        rl=RLSection(
            iterations=ITERATIONS,
            tasks_per_iteration=TASKS,
            sampling=SamplingConfig(max_new_tokens=16),
            trainer=GRPOConfig(group_size=GROUP, token_budget=4096),
        ),
        evaluation=EvalSection(tasks=1, gate_tasks=1, max_new_tokens=8),
        cluster=ClusterSection(store=store, ray=RaySection(workers=2, episodes_per_request=1)),
    )


def workers() -> list[str]:
    """The names of the live rollout workers."""
    return sorted(name for name in ray.util.list_named_actors() if name.startswith(ACTOR_PREFIX))


def kill_a_worker_once_iteration_1_starts(url: str, killed: list[str]) -> None:
    """Wait for the first session of iteration 1 in the store, then kill the first worker."""
    deadline = time.monotonic() + 900  # a loaded machine takes minutes to reach iteration 1
    with SessionStore.open(url) as store:
        while time.monotonic() < deadline:
            if any(s.startswith("rl-0001-") for s in store.session_ids()):
                name = workers()[0]
                ray.kill(ray.get_actor(name), no_restart=True)
                killed.append(name)
                return
            time.sleep(0.05)


@pytest.mark.slow
def test_a_worker_killed_mid_run_loses_no_episode_and_counts_none_twice(
    tmp_path: Path, ray_cluster: None, shared_store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sessionrl.cluster.ray_rollout")
    killed: list[str] = []
    seen: list[list[str]] = []
    killer = threading.Thread(target=kill_a_worker_once_iteration_1_starts, args=(shared_store_url, killed))
    killer.start()

    def after(record: dict[str, Any]) -> None:
        seen.append(workers())

    result = train(ray_run(tmp_path / "run", shared_store_url), on_iteration=after)
    killer.join()

    # training went on: every iteration ran and updated the policy, and the killed worker was replaced
    assert killed, "no worker was killed"
    assert [r["iteration"] for r in result.curve] == list(range(ITERATIONS))
    assert result.curve[-1]["policy_version"] == ITERATIONS
    assert all(r["sessions"] == TASKS * GROUP for r in result.curve)
    assert killed[0] not in seen[-1]
    assert len(seen[-1]) == 2
    assert any(int(name.rsplit(".", 1)[1]) > 2 for name in seen[-1]), seen

    assert f"rollout worker {killed[0]} died; replaced by" in caplog.text

    # every episode (iteration, task, k) ran to its verdict exactly once; a cut-off attempt has none and
    # was closed as abandoned
    with SessionStore.open(shared_store_url) as store:
        judged: Counter[str] = Counter()
        store_ids = store.session_ids()
        for sid in store_ids:
            match = EPISODE.fullmatch(sid)
            if match and task_success(store.get(sid)) is not None:
                judged[match.group(1)] += 1
                assert store.reward(sid).vector["long_term_reward"] is not None
            elif match:
                cut = store.get(sid)
                assert ABANDONED in cut.tags, sid
                assert cut.state.value in ("rejected", "finished")
    assert len(judged) == ITERATIONS * TASKS * GROUP
    assert set(judged.values()) == {1}


def test_weights_may_not_be_published_more_rarely_than_the_staleness_bound_allows(tmp_path: Path) -> None:
    RunConfig(
        run_dir=tmp_path, rl=RLSection(max_lag=1), cluster=ClusterSection(ray=RaySection(publish_every=2))
    )
    with pytest.raises(ValueError, match="publish_every"):
        RunConfig(rl=RLSection(max_lag=1), cluster=ClusterSection(ray=RaySection(publish_every=3)))


def test_the_store_is_the_run_folders_file_unless_the_cluster_names_one(tmp_path: Path) -> None:
    assert RunConfig(run_dir=tmp_path).store_url == f"sqlite:///{tmp_path.resolve() / 'sessions.db'}"
    named = RunConfig(cluster=ClusterSection(store="postgresql:///runs?host=/tmp"))
    assert named.store_url == "postgresql:///runs?host=/tmp"


@pytest.mark.slow
def test_workers_act_with_the_weights_published_every_other_version(
    tmp_path: Path, ray_cluster: None
) -> None:
    tiny = TinyModelConfig(vocab_size=300, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    tokenizer = train_tokenizer(['{"tool": "order_get", "params": {}}', '{"final": "done"}'], tiny)
    policy = HFPolicy(build_tiny_model(tiny, tokenizer), tokenizer, SamplingConfig(max_new_tokens=4))
    config = RunConfig(
        run_dir=tmp_path,
        env=EnvSection(train=4, dev=1, test=1),
        rollout=RolloutConfig(max_steps=1, full_schemas=False, domain_policy=False),
        rl=RLSection(max_lag=1),
        cluster=ClusterSection(ray=RaySection(workers=1, publish_every=2)),
    )
    task = config.env.build().tasks(Split.TRAIN)[0]
    acted: dict[int, set[int | None]] = {}
    with RayRollout(config, policy) as rollout, SessionStore.open(config.store_url) as store:
        for version in range(4):
            policy.version = version  # as an update would raise it (the weights stay put: a version is a tag)
            [ran] = rollout.run([EpisodeSpec(task, f"v{version}")], policy)
            acted[version] = {c.policy_version for c in store.get(ran.session_id).llm_calls}
    assert acted == {0: {0}, 1: {0}, 2: {2}, 3: {2}}
    assert rollout.published is not None
    assert rollout.published.version == 2
