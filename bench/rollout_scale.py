"""Rollout throughput: episodes/s of the in-process loop against 1 and 2 Ray rollout workers.

All three run the same episodes (a tiny orders policy, sampling, through the one episode driver) into one
store: a SQLite file in a temporary folder, or `--db postgresql://...`. The Ray runs start a local cluster
with a CPU per worker; each worker builds its replica and loads the weights before the clock starts, so
the figures are steady-state episode rates, not start-up. On one machine the workers share its cores with
each other and with the driver, so what a second worker gains depends on the cores free.

Last line: one JSON object with `inproc_eps`, `ray1_eps`, `ray2_eps` and `episodes`.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson
import ray

from sessionrl.cluster.ray_rollout import RayRollout
from sessionrl.envs.base import Split
from sessionrl.episodes import EpisodeSpec, Ran, RolloutConfig, expert, run_episodes
from sessionrl.episodes.llm import PolicyAgent, prompt_messages
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.store import SessionStore
from sessionrl.train.config import ClusterSection, EnvSection, RaySection, RunConfig
from sessionrl.train.llm.run import tokenizer_corpus

ROLLOUT = RolloutConfig(full_schemas=False, domain_policy=False, max_tool_chars=200, max_steps=4)
TINY = TinyModelConfig(vocab_size=700, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
SAMPLING = SamplingConfig(max_new_tokens=24)


def tiny_policy(config: RunConfig, folder: Path) -> HFPolicy:
    """A tiny, untrained policy whose tokenizer knows a few expert sessions of the orders domain."""
    env = config.env.build()
    tasks = env.tasks(Split.TRAIN)[:8]
    with SessionStore.open("sqlite://") as store:
        specs = [EpisodeSpec(t, f"demo-{t.task_id}") for t in tasks]
        ran = asyncio.run(run_episodes(env, specs, expert(env), store, ROLLOUT))
        demos = [store.get(r.session_id) for r in ran]
    system = prompt_messages(env, tasks[0], ROLLOUT)[0].content
    texts = tokenizer_corpus(env, system, demos, ROLLOUT.max_tool_chars)
    model, tokenizer = build_tiny_policy(texts, TINY, folder)
    return HFPolicy(model, tokenizer, SAMPLING)


def specs(config: RunConfig, label: str, n: int) -> list[EpisodeSpec]:
    """`n` episodes on training tasks (round robin), in sessions named by `label`."""
    tasks = config.env.build().tasks(Split.TRAIN)
    return [EpisodeSpec(tasks[i % len(tasks)], f"{label}-{i:04d}", seed=i) for i in range(n)]


def rate(run: Callable[[Sequence[EpisodeSpec]], list[Ran]], episodes: Sequence[EpisodeSpec]) -> float:
    """Episodes per second of one call of `run` on `episodes`."""
    start = time.perf_counter()
    ran = run(episodes)
    seconds = time.perf_counter() - start
    if len(ran) != len(episodes):
        raise RuntimeError(f"{len(episodes)} episodes asked, {len(ran)} ran")
    return len(ran) / seconds


def in_process(config: RunConfig, policy: HFPolicy, n: int) -> float:
    env, agent = config.env.build(), PolicyAgent(policy, policy.version)
    with SessionStore.open(config.store_url) as store:

        def run(episodes: Sequence[EpisodeSpec]) -> list[Ran]:
            return asyncio.run(run_episodes(env, episodes, agent, store, config.rollout))

        run(specs(config, "warm-inproc", 2))
        return rate(run, specs(config, "inproc", n))


def on_ray(config: RunConfig, policy: HFPolicy, workers: int, n: int) -> float:
    ray_section = RaySection(workers=workers, episodes_per_request=2)
    scaled = config.model_copy(update={"cluster": config.cluster.model_copy(update={"ray": ray_section})})
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        with RayRollout(scaled, policy) as rollout:
            rollout.run(specs(config, f"warm-ray{workers}", 2 * workers), policy)
            return rate(lambda episodes: rollout.run(episodes, policy), specs(config, f"ray{workers}", n))
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=48, help="timed episodes per setting")
    parser.add_argument("--db", default=None, help="store URL (default: a SQLite file in a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rollout-scale-") as tmp:
        folder = Path(tmp)
        store = args.db or f"sqlite:///{folder / 'sessions.db'}"
        config = RunConfig(
            run_dir=folder / "run",
            env=EnvSection(train=64, dev=4, test=4),
            rollout=ROLLOUT,
            cluster=ClusterSection(store=store),
        )
        policy = tiny_policy(config, folder / "policy")
        summary = {
            "inproc_eps": round(in_process(config, policy, args.episodes), 2),
            "ray1_eps": round(on_ray(config, policy, 1, args.episodes), 2),
            "ray2_eps": round(on_ray(config, policy, 2, args.episodes), 2),
            "episodes": args.episodes,
        }
    print(f"episodes/s over {args.episodes} episodes, store {store.split(':', 1)[0]}")
    for name in ("inproc_eps", "ray1_eps", "ray2_eps"):
        print(f"  {name:<11} {summary[name]:>8.2f}")
    print(orjson.dumps(summary).decode())


if __name__ == "__main__":
    main()
