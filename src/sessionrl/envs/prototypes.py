"""Action prototypes: frequent tool sequences mined from successful sessions, offered as macro-actions.

`mine_prototypes` counts the contiguous tool sequences (2 to `max_length` calls) of successful sessions,
keeps those found in at least `min_support` sessions, ranks them by the calls they would save
(``support · (length - 1)``) and keeps the first `top`. A prototype also carries its **parameter
constraints**: a parameter that had the same value at the same step of every occurrence (the template of a
notification, say) is fixed, so the policy no longer chooses it.

`MacroGymEnv` puts prototypes beside the atomic skills of a `DecisionGymEnv`. Each becomes one more skill
whose parameters are the free (unfixed) parameters of its steps, in order, so the structured policy's
layout (`structured.ActionLayout`) gives it heads like any skill. Choosing it runs its steps one by one,
stopping at the first call that does not succeed or when the episode ends; the rewards add up. A macro is
allowed when its first step is; its ``succeeded``/``failed`` bits say whether its last run completed. The
step's info counts the calls run (`macro_steps`), their new risk flags and the calls that raised one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from gymnasium import spaces

from sessionrl.envs.base import Split
from sessionrl.envs.gym import DecisionGymEnv, Observation, ParamSpec, StructuredEnv, StructuredEpisode
from sessionrl.session.model import CallStatus, Session

Call = tuple[str, Mapping[str, Any]]
"""One tool call: the tool's name and its parameters."""


@dataclass(frozen=True, slots=True)
class Prototype:
    """A macro-action: `skills` in order, `fixed` ``(step, parameter, value)`` constraints, and the
    number of successful sessions it was found in."""

    skills: tuple[str, ...]
    fixed: tuple[tuple[int, str, Any], ...]
    support: int

    @property
    def name(self) -> str:
        """The macro's skill name, e.g. ``check+sms+update``."""
        return "+".join(self.skills)

    def value(self, step: int, parameter: str) -> tuple[bool, Any]:
        """``(True, value)`` when `parameter` of step `step` is fixed, else ``(False, None)``."""
        for at, name, value in self.fixed:
            if at == step and name == parameter:
                return True, value
        return False, None


def session_calls(session: Session) -> tuple[Call, ...]:
    """The successful tool calls of a stored session, in order (failed and refused calls are retries)."""
    return tuple((c.tool, c.params) for c in session.tool_calls if c.status is CallStatus.SUCCESS)


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _constraints(occurrences: Sequence[Sequence[Call]]) -> tuple[tuple[int, str, Any], ...]:
    """``(step, parameter, value)`` for every parameter equal at its step across all `occurrences`."""
    fixed = []
    for step, (_, params) in enumerate(occurrences[0]):
        for name, value in sorted(params.items()):
            if all(name in o[step][1] and _key(o[step][1][name]) == _key(value) for o in occurrences):
                fixed.append((step, name, value))
    return tuple(fixed)


def mine_prototypes(
    sessions: Sequence[Sequence[Call]], *, min_support: int = 2, max_length: int = 3, top: int = 8
) -> tuple[Prototype, ...]:
    """The `top` prototypes of the successful `sessions` (their calls in order); see the module doc.

    Ties in calls saved go to the longer sequence, then to the alphabetically first.
    """
    if min_support < 1 or max_length < 2 or top < 0:
        raise ValueError("mine_prototypes needs min_support >= 1, max_length >= 2 and top >= 0")
    support: Counter[tuple[str, ...]] = Counter()
    occurrences: dict[tuple[str, ...], list[Sequence[Call]]] = {}
    for calls in sessions:
        tools = tuple(tool for tool, _ in calls)
        seen = set()
        for length in range(2, max_length + 1):
            for start in range(len(tools) - length + 1):
                pattern = tools[start : start + length]
                occurrences.setdefault(pattern, []).append(calls[start : start + length])
                seen.add(pattern)
        support.update(seen)
    frequent = [p for p, count in support.items() if count >= min_support]
    frequent.sort(key=lambda p: (-support[p] * (len(p) - 1), -len(p), p))
    return tuple(Prototype(p, _constraints(occurrences[p]), support[p]) for p in frequent[:top])


def expert_prototypes(env: StructuredEnv, top: int, *, min_support: int = 2) -> tuple[Prototype, ...]:
    """The `top` prototypes of the expert's plans for the training tasks of `env` (the demonstrations
    imitation learns from, taken as the successful sessions)."""
    plans = [[(s.tool, dict(s.params)) for s in env.expert(t).steps] for t in env.tasks(Split.TRAIN)]
    return mine_prototypes(plans, min_support=min_support, top=top)


class MacroGymEnv:
    """A `DecisionGymEnv` whose skill index also selects prototypes (see the module doc). Indices: the
    inner skills, then the prototypes, then finish."""

    def __init__(self, inner: DecisionGymEnv, prototypes: Sequence[Prototype]) -> None:
        unknown = {s for p in prototypes for s in p.skills} - set(inner.skill_names)
        if unknown:
            raise ValueError(f"prototypes name skills the environment lacks: {sorted(unknown)}")
        self.inner = inner
        self.prototypes = tuple(prototypes)
        self.atomic = len(inner.skill_names)
        self.skill_names = inner.skill_names + tuple(p.name for p in self.prototypes)
        self.param_specs: dict[str, tuple[ParamSpec, ...]] = dict(inner.param_specs)
        for p in self.prototypes:
            self.param_specs[p.name] = self._free_specs(p)
        n = len(self.skill_names)
        self.params_width = max(inner.params_width, *(len(s) for s in self.param_specs.values()))
        self.action_space = spaces.Dict(
            {
                "skill": spaces.Discrete(n + 1),
                "params": spaces.Box(-1.0, 1.0, (self.params_width,), np.float32),
            }
        )
        inner_space = inner.observation_space
        if not isinstance(inner_space, spaces.Dict):
            raise TypeError("MacroGymEnv wraps a DecisionGymEnv, whose observations are a Dict")
        self.observation_space = spaces.Dict(
            {
                "step": inner_space["step"],
                "succeeded": spaces.MultiBinary(n),
                "failed": spaces.MultiBinary(n),
                "features": inner_space["features"],
                "action_mask": spaces.MultiBinary(n + 1),
            }
        )
        self._macro_bits = np.zeros((2, len(self.prototypes)), np.int8)  # succeeded, failed

    def _free_specs(self, prototype: Prototype) -> tuple[ParamSpec, ...]:
        specs = []
        for step, skill in enumerate(prototype.skills):
            for spec in self.inner.param_specs[skill]:
                if not prototype.value(step, spec.name)[0]:
                    specs.append(replace(spec, name=f"{step}:{spec.name}"))
        return tuple(specs)

    @property
    def finish_action(self) -> int:
        """The `skill` index that finishes the episode."""
        return len(self.skill_names)

    @property
    def episode(self) -> StructuredEpisode:
        """The inner environment's current episode."""
        return self.inner.episode

    def __enter__(self) -> MacroGymEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start an episode of the inner environment."""
        obs, info = self.inner.reset(seed=seed, options=options)
        self._macro_bits[:] = 0
        return self._extend(obs), info

    def close(self) -> None:
        """Close the inner environment."""
        self.inner.close()

    def _extend(self, obs: Observation) -> Observation:
        mask = np.asarray(obs["action_mask"])
        firsts = [mask[self.inner.skill_names.index(p.skills[0])] for p in self.prototypes]
        allowed = np.concatenate([mask[: self.atomic], np.asarray(firsts, np.int8), mask[self.atomic :]])
        return {
            **obs,
            "succeeded": np.concatenate([obs["succeeded"], self._macro_bits[0]]),
            "failed": np.concatenate([obs["failed"], self._macro_bits[1]]),
            "action_mask": allowed.astype(np.int8),
        }

    def step(self, action: Mapping[str, Any]) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """An atomic call, finish, or a prototype's calls in turn (see the module doc)."""
        return self.inner.run(self.astep(action))

    async def astep(self, action: Mapping[str, Any]) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """`step` as a coroutine (for `sessionrl.envs.gym.DecisionVectorEnv`)."""
        index, params = int(action["skill"]), np.asarray(action["params"], np.float32)
        if index < self.atomic or index == self.finish_action:
            inner_index = min(index, self.inner.finish_action)
            inner = {"skill": inner_index, "params": params[: self.inner.params_width]}
            obs, reward, terminated, truncated, info = await self.inner.astep(inner)
            return self._extend(obs), reward, terminated, truncated, info
        return await self._run_macro(index - self.atomic, params)

    async def _run_macro(
        self, macro: int, params: np.ndarray
    ) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        prototype, free, total = self.prototypes[macro], iter(params.tolist()), 0.0
        flags = risky = 0
        for step, skill in enumerate(prototype.skills):
            bounds = self.inner.episode.param_bounds().get(skill, {})
            vector = np.zeros(self.inner.params_width, np.float32)
            for i, spec in enumerate(self.inner.param_specs[skill]):
                fixed, value = prototype.value(step, spec.name)
                vector[i] = spec.encode(value, bounds.get(spec.name)) if fixed else next(free)
            index = self.inner.skill_names.index(skill)
            call = {"skill": index, "params": vector}
            obs, reward, terminated, truncated, info = await self.inner.astep(call)
            total += reward
            flags += info.get("risk_flags", 0)
            risky += info.get("risk_flags", 0) > 0
            completed = info.get("status") == "success" and step == len(prototype.skills) - 1
            if terminated or truncated or info.get("status") != "success" or completed:
                break
        self._macro_bits[:, macro] = (int(completed), int(not completed))
        counts = {"macro_steps": step + 1, "risk_flags": flags, "risky_calls": risky}
        return self._extend(obs), total, terminated, truncated, {**info, **counts}


def action_space_sizes(env: DecisionGymEnv, prototypes: Sequence[Prototype]) -> dict[str, int]:
    """The skill head's size before and after adding `prototypes` (finish counted in both)."""
    return {"atomic": len(env.skill_names) + 1, "with_prototypes": len(env.skill_names) + len(prototypes) + 1}


__all__ = [
    "Call",
    "MacroGymEnv",
    "Prototype",
    "action_space_sizes",
    "expert_prototypes",
    "mine_prototypes",
    "session_calls",
]
