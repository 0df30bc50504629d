"""A Gymnasium view of a task environment, for structured (non-text) policies.

`DecisionGymEnv(env, split, seed)` turns each `reset` into a fresh episode of a task drawn from `split`, and
each `step` into at most one skill call.

Actions are `{"skill": Discrete(n + 1), "params": Box(-1, 1, (width,))}`. Skill `i < n` is the i-th
contract by name; skill `n` is *finish*: the episode's `summary()` is sent as the final message and the
episode is judged. A skill's bounded parameters (`param_specs`: numbers with a minimum and a maximum,
enums, booleans; sorted by name) read `params[0]`, `params[1]`, ... in order, each `x` clipped to [-1, 1]:
- a number maps linearly onto its range, `low + (high - low) * (x + 1) / 2`, where the episode may narrow
  the contract's range (`param_bounds`, e.g. a refund up to what is left of the order); an integer rounds;
- a choice among `k` values picks index `min(floor((x + 1) / 2 * k), k - 1)`, so [-1, 1] splits into `k`
  equal bins.
Every other parameter (ids, free text) is filled by the episode's `bind` from the task and earlier answers.
Unused `params` entries are ignored.

Observations are a Dict: `step` (steps taken / `max_steps`), `succeeded` (1 where the skill has succeeded
at least once), `failed` (1 where the skill's latest call failed or was refused), `features` (the domain's
numeric features, in [0, 1]) and `action_mask` (1 where the skill's preconditions hold now; finish is
always allowed).

Rewards: `-failure_penalty` for each failed or refused call (a masked skill is refused without running),
`-risk_penalty` for each new risk flag, and `success_reward` when the episode is judged solved.
`terminated` is True once the policy finishes or the domain ends the episode (which is then judged);
`truncated` is True when `max_steps` calls pass first.

`info` of a step names the skill and its `status` (``success``, ``error``, ``refused``), counts the step's
new risk flags (`risk_flags`) and, once the episode is judged, adds `success` and the judge's `checks`.

Skill calls run on an event loop the environment makes at its first call and keeps until `close()` (or
`with DecisionGymEnv(...) as env:`); a fresh loop per call cost a third of a step. `astep` is the same step
as a coroutine, so `DecisionVectorEnv` can run the calls of many environments together on one loop.

`DecisionVectorEnv` steps a batch of such environments as one `gymnasium.vector.VectorEnv`: observations
and actions batched along a first axis of ``num_envs``, one loop for every call of the batch (gathered, so
skills that wait overlap), and an environment whose episode ended is reset in the same step
(`AutoresetMode.SAME_STEP`). Its `infos` hold, per environment, `risk_flags`, `calls` (skill calls run,
a macro-action's several; 0 for finish) and `risky_calls` (those that raised a flag), and for each
environment whose episode ended (masked by `_success`) `success`, `final_obs`, and the new episode's
`task_id` and `instruction`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from sessionrl.envs.base import DecisionEnv, Episode, Split, Task
from sessionrl.envs.faults import Faults
from sessionrl.skills import ManualClock, Skill, SkillContract, SkillError
from sessionrl.skills.schema import validation_errors, validator_for

Json = dict[str, Any]
T = TypeVar("T")
Observation = dict[str, Any]
"""One observation: the arrays named in the module doc."""


class StructuredEpisode(Episode, Protocol):
    """An episode a structured policy can drive: masks, features, and parameter binding."""

    @property
    def risk_flags(self) -> Sequence[str]:
        """Risky calls so far, in order."""
        ...

    def action_mask(self) -> Mapping[str, bool]:
        """Which skills may succeed now, by name."""
        ...

    def features(self) -> Sequence[float]:
        """Numeric features in [0, 1], in the environment's `feature_names` order."""
        ...

    def param_bounds(self) -> Mapping[str, Mapping[str, tuple[float, float]]]:
        """Episode ranges of numeric parameters by skill and parameter; others keep the contract's."""
        ...

    def bind(self, skill: str, chosen: Mapping[str, Any]) -> Json:
        """The full parameters of a call to `skill`, given the policy's values for its bounded parameters."""
        ...

    def summary(self) -> str:
        """A final message stating what the episode did."""
        ...


class StructuredEnv(DecisionEnv, Protocol):
    """A `DecisionEnv` whose episodes are `StructuredEpisode`s and which names their features."""

    @property
    def feature_names(self) -> Sequence[str]:
        """Names of the episodes' features, in order."""
        ...

    def episode(self, task: Task, *, seed: int = 0, faults: Faults | None = None) -> StructuredEpisode:
        """A fresh episode of `task`."""
        ...


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """A parameter a structured policy sets: a numeric range, or a finite set of choices."""

    name: str
    low: float = -1.0
    high: float = 1.0
    choices: tuple[Any, ...] = ()
    integer: bool = False

    def decode(self, x: float, bounds: tuple[float, float] | None = None) -> Any:
        """The parameter value for policy output `x` (see the module doc); `bounds` narrow the range.

        >>> ParamSpec("reason", choices=("a", "b", "c")).decode(0.0)
        'b'
        >>> ParamSpec("amount", low=0.0, high=10.0).decode(0.5)
        7.5
        """
        x = min(max(float(x), -1.0), 1.0) if math.isfinite(x) else 0.0
        if self.choices:
            return self.choices[min(int((x + 1.0) / 2.0 * len(self.choices)), len(self.choices) - 1)]
        low, high = bounds if bounds is not None else (self.low, self.high)
        value = low + (high - low) * (x + 1.0) / 2.0
        return round(value) if self.integer else value

    def encode(self, value: Any, bounds: tuple[float, float] | None = None) -> float:
        """The policy output in [-1, 1] that `decode` maps to `value`: a choice's bin centre, a number's
        place in its range (clipped). Used to turn demonstrations into actions.

        >>> ParamSpec("reason", choices=("a", "b", "c")).encode("c")
        0.6666666666666667
        >>> ParamSpec("amount", low=0.0, high=10.0).encode(7.5)
        0.5
        """
        if self.choices:
            return (2 * self.choices.index(value) + 1) / len(self.choices) - 1.0
        low, high = bounds if bounds is not None else (self.low, self.high)
        if high <= low:
            return 0.0
        return min(max(2.0 * (float(value) - low) / (high - low) - 1.0, -1.0), 1.0)


def param_specs(contract: SkillContract) -> tuple[ParamSpec, ...]:
    """The bounded parameters of `contract`, sorted by name: enums, booleans, and numbers with both bounds."""
    specs = []
    for name, schema in sorted(contract.input_schema.get("properties", {}).items()):
        kind = schema.get("type")
        if "enum" in schema:
            specs.append(ParamSpec(name, choices=tuple(schema["enum"])))
        elif kind == "boolean":
            specs.append(ParamSpec(name, choices=(False, True)))
        elif kind in ("number", "integer") and {"minimum", "maximum"} <= schema.keys():
            specs.append(
                ParamSpec(name, float(schema["minimum"]), float(schema["maximum"]), integer=kind == "integer")
            )
    return tuple(specs)


@dataclass(frozen=True, slots=True)
class GymConfig:
    """Episode length and reward weights of a `DecisionGymEnv`."""

    max_steps: int = 12
    """Calls (finish included) before the episode is truncated."""
    success_reward: float = 1.0
    """Reward when the judged episode is solved."""
    failure_penalty: float = 0.05
    """Cost of a failed or refused call."""
    risk_penalty: float = 0.5
    """Cost of each new risk flag."""

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"GymConfig.max_steps must be at least 1, got {self.max_steps}")


class DecisionGymEnv(gym.Env[Observation, dict[str, Any]]):
    """Gymnasium environment over one split of a structured environment (see the module doc)."""

    def __init__(
        self,
        env: StructuredEnv,
        split: Split = Split.TRAIN,
        seed: int | None = None,
        *,
        config: GymConfig | None = None,
        faults: Faults | None = None,
    ) -> None:
        self.env = env
        self.split = split
        self.config = config or GymConfig()
        self.faults = faults
        self._tasks = env.tasks(split)
        if not self._tasks:
            raise ValueError(f"{env.name} has no {split} tasks to draw episodes from")
        self._contracts = {contract.name: contract for contract in env.contracts()}
        self.skill_names: tuple[str, ...] = tuple(sorted(self._contracts))
        self.param_specs = {name: param_specs(self._contracts[name]) for name in self.skill_names}
        self._validators = {name: validator_for(c.input_schema) for name, c in self._contracts.items()}
        n = len(self.skill_names)
        self.params_width = max(1, *(len(specs) for specs in self.param_specs.values()))
        """Length of the `params` Box: the most bounded parameters any skill has."""
        self.action_space = spaces.Dict(
            {
                "skill": spaces.Discrete(n + 1),
                "params": spaces.Box(-1.0, 1.0, (self.params_width,), np.float32),
            }
        )
        self.observation_space = spaces.Dict(
            {
                "step": spaces.Box(0.0, 1.0, (1,), np.float32),
                "succeeded": spaces.MultiBinary(n),
                "failed": spaces.MultiBinary(n),
                "features": spaces.Box(0.0, 1.0, (len(env.feature_names),), np.float32),
                "action_mask": spaces.MultiBinary(n + 1),
            }
        )
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        self._episode: StructuredEpisode | None = None
        self._skills: dict[str, Skill] = {}
        self._clock = ManualClock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._steps = 0
        self._succeeded = np.zeros(n, np.int8)
        self._failed = np.zeros(n, np.int8)

    @property
    def finish_action(self) -> int:
        """The `skill` index that finishes the episode."""
        return len(self.skill_names)

    @property
    def episode(self) -> StructuredEpisode:
        """The current episode (after `reset`)."""
        if self._episode is None:
            raise RuntimeError("call reset() before using the environment")
        return self._episode

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Json]:
        """Start an episode: the task `options["task_id"]` if given, else one drawn from the split."""
        super().reset(seed=seed)
        task = self._pick(options or {})
        episode_seed = int(self.np_random.integers(2**31))
        self._episode = self.env.episode(task, seed=episode_seed, faults=self.faults)
        self._skills = {skill.name: skill for skill in self._episode.skills()}
        self._clock = ManualClock()
        self._steps = 0
        self._succeeded[:] = 0
        self._failed[:] = 0
        return self._observation(), {"task_id": task.task_id, "instruction": task.instruction}

    def _pick(self, options: Mapping[str, Any]) -> Task:
        if "task_id" not in options:
            return self._tasks[int(self.np_random.integers(len(self._tasks)))]
        found = next((task for task in self._tasks if task.task_id == options["task_id"]), None)
        if found is None:
            raise ValueError(f"no task {options['task_id']!r} in the {self.split} split of {self.env.name}")
        return found

    def decode(self, skill: str, params: Sequence[float] | np.ndarray) -> Json:
        """The bounded parameter values `params` stand for in a call to `skill` in the current episode."""
        bounds = self.episode.param_bounds().get(skill, {})
        return {
            spec.name: spec.decode(float(params[i]), bounds.get(spec.name))
            for i, spec in enumerate(self.param_specs[skill])
        }

    def action_for(self, skill: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """The action that calls `skill` with `params`' bounded values in the current episode."""
        bounds = self.episode.param_bounds().get(skill, {})
        values = np.zeros(self.params_width, np.float32)
        for i, spec in enumerate(self.param_specs[skill]):
            values[i] = spec.encode(params[spec.name], bounds.get(spec.name))
        return {"skill": self.skill_names.index(skill), "params": values}

    def step(self, action: Mapping[str, Any]) -> tuple[Observation, float, bool, bool, Json]:
        """Run one call (or finish); see the module doc for rewards and endings."""
        return self.run(self.astep(action))

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` to its end on the environment's own event loop (made at the first call)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coroutine)

    async def astep(self, action: Mapping[str, Any]) -> tuple[Observation, float, bool, bool, Json]:
        """`step` as a coroutine, awaiting the skill call on the running loop."""
        episode = self.episode
        index = int(action["skill"])
        self._steps += 1
        if index == self.finish_action:
            reward, info = self._judge()
            return self._observation(), reward, True, False, {**info, "risk_flags": 0}
        name = self.skill_names[index]
        flags_before = len(episode.risk_flags)
        info = await self._call(name, action["params"])
        ok = info["status"] == "success"
        self._succeeded[index] |= ok
        self._failed[index] = not ok
        new_flags = len(episode.risk_flags) - flags_before
        info["risk_flags"] = new_flags
        reward = -self.config.risk_penalty * new_flags - (0.0 if ok else self.config.failure_penalty)
        terminated = episode.terminated
        if terminated:
            bonus, judged = self._judge()
            reward, info = reward + bonus, {**info, **judged}
        truncated = not terminated and self._steps >= self.config.max_steps
        return self._observation(), reward, terminated, truncated, info

    async def _call(self, name: str, raw: Any) -> Json:
        """Decode, bind, validate and run one call; describe what happened."""
        if not self.episode.action_mask().get(name, False):
            return {"skill": name, "status": "refused", "error_code": "MASKED"}
        params = self.episode.bind(name, self.decode(name, np.asarray(raw, dtype=np.float64)))
        problems = validation_errors(self._validators[name], params)
        if problems:
            return {"skill": name, "params": params, "status": "error", "error_code": "INVALID_PARAMS"}
        try:
            output = await self._skills[name].invoke(params, self._clock)
        except SkillError as error:
            return {"skill": name, "params": params, "status": "error", "error_code": error.code}
        return {"skill": name, "params": params, "status": "success", "output": output}

    def __getstate__(self) -> dict[str, Any]:
        """The state to copy: all but the event loop (a copy makes its own at its first call)."""
        return {**self.__dict__, "_loop": None}

    def close(self) -> None:
        """Close the event loop the skill calls ran on (a later call makes a new one)."""
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        super().close()

    def _judge(self) -> tuple[float, Json]:
        """Send the episode's summary and judge it."""
        message = self.episode.summary()
        outcome = self.episode.outcome([message])
        reward = self.config.success_reward if outcome.success else 0.0
        return reward, {"message": message, "success": outcome.success, "checks": dict(outcome.checks)}

    def _observation(self) -> Observation:
        episode = self.episode
        mask = episode.action_mask()
        allowed = [mask.get(name, False) for name in self.skill_names] + [True]
        return {
            "step": np.array([min(self._steps / self.config.max_steps, 1.0)], np.float32),
            "succeeded": self._succeeded.copy(),
            "failed": self._failed.copy(),
            "features": np.asarray(episode.features(), np.float32),
            "action_mask": np.asarray(allowed, np.int8),
        }


def batch_observations(observations: Sequence[Observation]) -> Observation:
    """Single observations as one batch, each part stacked along a new first axis."""
    # np.array of same-shaped arrays stacks them as np.stack does, in a third of the time for arrays this
    # small (and raises on ragged ones)
    return {key: np.array([obs[key] for obs in observations]) for key in observations[0]}


class AsyncView(Protocol):
    """What `DecisionVectorEnv` steps: a `DecisionGymEnv`, or a view over one (`prototypes.MacroGymEnv`)."""

    @property
    def observation_space(self) -> spaces.Space[Any]:
        """One environment's observation space."""
        ...

    @property
    def action_space(self) -> spaces.Space[Any]:
        """One environment's action space."""
        ...

    @property
    def finish_action(self) -> int:
        """The `skill` index that finishes the episode."""
        ...

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Json]:
        """Start an episode."""
        ...

    async def astep(self, action: Mapping[str, Any]) -> tuple[Observation, float, bool, bool, Json]:
        """One step as a coroutine."""
        ...

    def close(self) -> None:
        """Release what the view holds."""
        ...


class DecisionVectorEnv(VectorEnv[Observation, dict[str, Any], np.ndarray]):
    """A batch of Gymnasium views stepped together on one event loop (see the module doc)."""

    def __init__(self, envs: Sequence[AsyncView]) -> None:
        if not envs:
            raise ValueError("DecisionVectorEnv needs at least one environment")
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.envs = tuple(envs)
        self.num_envs = len(self.envs)
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._finish = [env.finish_action for env in self.envs]

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Json]:
        """Reset every environment (`seed`: one for all, offset by position, or one each)."""
        seeds = (
            seed
            if isinstance(seed, list)
            else [None if seed is None else seed + i for i in range(self.num_envs)]
        )
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset got {len(seeds)} seeds for {self.num_envs} environments")
        pairs = [env.reset(seed=s, options=options) for env, s in zip(self.envs, seeds, strict=True)]
        infos = {
            key: np.array([info[key] for _, info in pairs], dtype=object)
            for key in ("task_id", "instruction")
        }
        return batch_observations([obs for obs, _ in pairs]), infos

    def step(
        self, actions: Mapping[str, Any]
    ) -> tuple[Observation, np.ndarray, np.ndarray, np.ndarray, Json]:
        """Step every environment with its row of `actions` (``skill`` ``[N]``, ``params`` ``[N, width]``);
        the calls run together on the vector's loop, and ended episodes restart (see the module doc)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        skills, params = np.asarray(actions["skill"]).tolist(), np.asarray(actions["params"])
        loop = self._loop
        # one task per call, gathered straight away: no wrapping coroutine, so fewer turns of the loop
        tasks = [
            loop.create_task(env.astep({"skill": skills[i], "params": params[i]}))
            for i, env in enumerate(self.envs)
        ]
        results = loop.run_until_complete(asyncio.gather(*tasks))
        n = self.num_envs
        rewards, terminated, truncated = np.empty(n, np.float64), np.empty(n, np.bool_), np.empty(n, np.bool_)
        flags, calls, risky = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
        ended = np.zeros(n, np.bool_)
        success, final_obs = np.zeros(n, np.bool_), np.full(n, None, dtype=object)
        task_ids, instructions = np.full(n, None, dtype=object), np.full(n, None, dtype=object)
        observations = []
        for i, (obs, reward, ended_here, cut_here, info) in enumerate(results):
            rewards[i], terminated[i], truncated[i] = reward, ended_here, cut_here
            flags[i] = info.get("risk_flags", 0)
            calls[i] = 0 if skills[i] == self._finish[i] else info.get("macro_steps", 1)
            risky[i] = info.get("risky_calls", flags[i] > 0)
            if ended_here or cut_here:
                ended[i], success[i], final_obs[i] = True, bool(info.get("success", False)), obs
                obs, reset_info = self.envs[i].reset()
                task_ids[i], instructions[i] = reset_info["task_id"], reset_info["instruction"]
            observations.append(obs)
        infos: Json = {
            "risk_flags": flags,
            "calls": calls,
            "risky_calls": risky,
            "success": success,
            "final_obs": final_obs,
            "task_id": task_ids,
            "instruction": instructions,
        }
        for key in ("success", "final_obs", "task_id", "instruction"):
            infos[f"_{key}"] = ended
        return batch_observations(observations), rewards, terminated, truncated, infos

    def close_extras(self, **kwargs: Any) -> None:
        """Close every environment and the loop."""
        for env in self.envs:
            env.close()
        if self._loop is not None:
            self._loop.close()
            self._loop = None
