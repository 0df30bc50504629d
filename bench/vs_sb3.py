"""Our PPO against Stable-Baselines3's MaskablePPO on the orders Gymnasium view: speed and completion.

Both learn from scratch on the same `DecisionGymEnv` (orders, instant and deterministic skills), with the
same seeds, the same budget of environment steps and the same PPO settings (8 environments × 64 steps per
round, 4 epochs of 4 minibatches, Adam 1e-3, γ 0.99, GAE λ 0.95, clip 0.2, entropy 0.01, value 0.5, grad
norm 0.5, two tanh layers of 64, one torch thread).

SB3 takes no Dict action, so it sees the environment through `SB3View`: a MultiDiscrete action (the skill,
then each parameter slot in `BINS` levels over [-1, 1]) with the skill mask offered through
`action_masks()` (masks matter: masked skills are refused and cost a penalty), and the same hashed query
embedding our policy reads, as one more observation entry (each distinct instruction encoded once, as our
collector does). Our policy keeps its continuous parameter heads.

Reported, as mean over seeds: environment steps per second of the whole training call (rollouts and updates),
per wall second and per CPU second of the process, and the held-out completion of the greedy policy on the
test split. Each run has a fresh process, and by default (`--jobs 1`) one runs at a time, the libraries
alternating: runs that share the cores are not a fair race even per CPU second, since contention slows SB3's
process more than ours (on 2 quiet cores our ratio per CPU second was 1.63 one at a time, 1.73 side by side).
Each seed's two runs are neighbours in time, so the ratio of that pair is also printed, per wall and per
CPU second: on a shared machine the speed of a whole run moves by tens of percent within minutes, and
the spread of the paired ratios shows how far one figure can be trusted. The last line is one JSON object
(``<library>_steps_per_s``, ``<library>_steps_per_cpu_s``, ``<library>_completion``, and the paired
ratios' median, ``ratio_per_s_median`` and ``ratio_per_cpu_s_median``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from rich.console import Console
from rich.table import Table

from sessionrl.envs import DecisionEnv, build
from sessionrl.envs.base import Split
from sessionrl.envs.gym import DecisionGymEnv, GymConfig
from sessionrl.policy.encoder import HashingEncoder
from sessionrl.train.structured.ppo import PPOConfig, train_ppo
from sessionrl.train.structured.rollout import StructuredRunConfig, Summary, evaluate
from sessionrl.train.threads import torch_threads

BINS = 21
ENVS, STEPS = 8, 64


def orders() -> DecisionEnv:
    return build("orders", time_factor=0, transient_failures=False)


class SB3View(gym.Wrapper[dict[str, np.ndarray], np.ndarray, dict[str, np.ndarray], dict[str, Any]]):
    """A `DecisionGymEnv` with MultiDiscrete actions, the query embedding observed, and `action_masks()`."""

    def __init__(
        self, env: DecisionGymEnv, encoder: HashingEncoder, queries: dict[str, np.ndarray] | None = None
    ) -> None:
        super().__init__(env)
        self.encoder = encoder
        width = env.action_space["params"].shape[0]
        self.skills = env.finish_action + 1
        self.action_space = spaces.MultiDiscrete([self.skills] + [BINS] * width)
        query = spaces.Box(-1.0, 1.0, (encoder.dim,), np.float32)
        self.observation_space = spaces.Dict({**env.observation_space.spaces, "query": query})
        self._query = np.zeros(encoder.dim, np.float32)
        self._queries = {} if queries is None else queries
        """Each distinct instruction's embedding, encoded once (as our collector does); views may share it."""
        self._mask = np.ones(self.skills, bool)

    def _observe(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._mask = obs["action_mask"].astype(bool)
        return {**obs, "query": self._query}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        instruction = info["instruction"]
        if instruction not in self._queries:
            self._queries[instruction] = self.encoder.encode([instruction])[0].numpy()
        self._query = self._queries[instruction]
        return self._observe(obs), info

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        params = -1.0 + 2.0 * np.asarray(action[1:], np.float32) / (BINS - 1)
        obs, reward, terminated, truncated, info = self.env.step({"skill": int(action[0]), "params": params})
        return self._observe(obs), float(reward), terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """Allowed values of each action dimension, concatenated: the skill mask, then every bin."""
        return np.concatenate([self._mask, np.ones(BINS * (len(self.action_space.nvec) - 1), bool)])


class Clock:
    """Wall and CPU seconds of a block (this process's CPU time: on a shared machine the wall time also
    counts the time other processes held the cores)."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def run_ours(seed: int, iterations: int) -> tuple[float, float, float]:
    """Steps per wall second and per CPU second of `train_ppo`, and the greedy test completion."""
    env = orders()
    run = StructuredRunConfig(iterations=iterations, num_envs=ENVS, rollout_steps=STEPS, seed=seed)
    with Clock() as clock:
        trained = train_ppo(env, PPOConfig(run=run))
    with torch_threads(1):
        test = Summary.of(evaluate(trained.policy, trained.encoder, env, Split.TEST))
    return run.total_steps / clock.wall, run.total_steps / clock.cpu, test.completion


def run_sb3(seed: int, iterations: int) -> tuple[float, float, float]:
    """Steps per wall second and per CPU second of `MaskablePPO.learn`, and the greedy test completion."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    torch.set_num_threads(1)
    env = orders()
    encoder = HashingEncoder(StructuredRunConfig().text_dim)
    queries: dict[str, np.ndarray] = {}

    def make(i: int) -> SB3View:
        gym_env = DecisionGymEnv(env, Split.TRAIN, seed=seed * 1000 + i, config=GymConfig())
        return SB3View(gym_env, encoder, queries)

    vec = DummyVecEnv([lambda i=i: make(i) for i in range(ENVS)])
    model = MaskablePPO(
        "MultiInputPolicy",
        vec,
        n_steps=STEPS,
        batch_size=ENVS * STEPS // 4,
        n_epochs=4,
        learning_rate=1e-3,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        policy_kwargs={"net_arch": [64, 64], "activation_fn": torch.nn.Tanh},
        seed=seed,
        device="cpu",
    )
    steps = iterations * ENVS * STEPS
    with Clock() as clock:
        model.learn(total_timesteps=steps)
    view = SB3View(DecisionGymEnv(env, Split.TEST, seed=seed), encoder)
    solved = []
    for task in env.tasks(Split.TEST):
        obs, _ = view.reset(options={"task_id": task.task_id})
        done, info = False, {}
        while not done:
            action, _ = model.predict(obs, action_masks=view.action_masks(), deterministic=True)
            obs, _, terminated, truncated, info = view.step(action)
            done = terminated or truncated
        solved.append(bool(info.get("success", False)))
    return steps / clock.wall, steps / clock.cpu, sum(solved) / len(solved)


def run_one(library: str, seed: int, iterations: int) -> tuple[str, float, float, float]:
    # the first optimiser built in a process imports torch's compiler stack (seconds): not on the clock
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    return (library, *(run_ours if library == "ours" else run_sb3)(seed, iterations))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per library")
    parser.add_argument("--iterations", type=int, default=30, help="rounds of 512 steps per run")
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs at once (more than 1 makes them contend for the cores)"
    )
    args = parser.parse_args()
    jobs = [(lib, s, args.iterations) for s in range(args.seeds) for lib in ("ours", "sb3")]
    with ProcessPoolExecutor(max_workers=args.jobs, max_tasks_per_child=1) as pool:
        results = list(pool.map(run_one, *zip(*jobs, strict=True)))
    table = Table(title=f"orders from scratch, {args.seeds} seeds × {args.iterations * ENVS * STEPS} steps")
    for column in ("library", "env steps / s", "env steps / CPU s", "test completion"):
        table.add_column(column, justify="right")
    summary: dict[str, float] = {}
    for library, name in (("ours", "sessionrl PPO"), ("sb3", "SB3 MaskablePPO")):
        runs = [r[1:] for r in results if r[0] == library]
        wall, cpu, completion = (statistics.fmean(column) for column in zip(*runs, strict=True))
        table.add_row(name, f"{wall:.0f}", f"{cpu:.0f}", f"{completion:.3f}")
        summary[f"{library}_steps_per_s"] = round(wall, 1)
        summary[f"{library}_steps_per_cpu_s"] = round(cpu, 1)
        summary[f"{library}_completion"] = round(completion, 4)
    console = Console(width=120)
    console.print(table)
    wall_ratio = summary["ours_steps_per_s"] / summary["sb3_steps_per_s"]
    cpu_ratio = summary["ours_steps_per_cpu_s"] / summary["sb3_steps_per_cpu_s"]
    console.print(f"speed ratio ours / SB3: {wall_ratio:.2f} per wall second, {cpu_ratio:.2f} per CPU second")
    for unit, column, key in (("wall", 1, "ratio_per_s_median"), ("CPU", 2, "ratio_per_cpu_s_median")):
        ratios = paired_ratios(results, column)
        summary[key] = round(statistics.median(ratios), 3)
        listed = ", ".join(f"{r:.2f}" for r in ratios)
        console.print(f"per seed, per {unit} second: {listed} (median {summary[key]:.2f})")
    print(json.dumps(summary))


def paired_ratios(results: list[tuple[str, float, float, float]], column: int) -> list[float]:
    """Ours over SB3 in `column` (1: steps per wall second, 2: per CPU second) for each seed, the two runs
    of a seed being the neighbouring pair of `results`."""
    ours = [r[column] for r in results if r[0] == "ours"]
    sb3 = [r[column] for r in results if r[0] == "sb3"]
    return [a / b for a, b in zip(ours, sb3, strict=True)]


if __name__ == "__main__":
    main()
