"""One registry of task environments: a name (or `module:Class`) and keyword options give a `DecisionEnv`.

```python
from sessionrl.envs import build, register

register("shop", ShopEnv)                   # a factory: a class or a function taking keyword options
env = build("shop", data="data/shop")      # options are checked against the factory's signature
env = build("mypkg.shop:ShopEnv", data="data/shop")   # no registration needed
```

Names come from three places: the built-in domains (`retail`, `orders`, `clinic`), which register
themselves when their package is imported; `register` calls; and installed packages, which declare a
factory under the entry-point group `sessionrl.envs` (`[project.entry-points."sessionrl.envs"]` in their
`pyproject.toml`, `shop = "mypkg.shop:ShopEnv"`). A name holding a `:` is imported as `module:attribute`,
with the current directory on the import path.

A factory's options are its keyword parameters, typed by its annotations: `build` refuses an unknown
option by naming the accepted ones, and validates each value with pydantic, so a YAML config or a command
line can pass strings and numbers. `config_factory` turns a config dataclass into such a factory.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
import typing
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any, Final, TypeVar

from pydantic import ConfigDict, ValidationError, create_model

from sessionrl.envs.base import DecisionEnv
from sessionrl.errors import SessionRLError

EnvFactory = Callable[..., DecisionEnv]
"""Builds an environment from keyword options (a `DecisionEnv` class is one)."""

ENTRY_POINT_GROUP: Final = "sessionrl.envs"
"""The entry-point group through which installed packages add environments."""

BUILT_INS: Final = ("sessionrl.envs.retail", "sessionrl.envs.orders", "sessionrl.envs.clinic")
"""Packages of the domains that ship with sessionrl; each registers itself when imported."""

_PROTOCOL: Final = ("name", "system_prompt", "contracts", "tasks", "episode", "expert")

C = TypeVar("C")
E = TypeVar("E", bound=DecisionEnv)


class EnvBuildError(SessionRLError):
    """An environment cannot be built; the message says what to change."""


class UnknownEnv(EnvBuildError, LookupError):
    """No environment goes by this name; the message lists the known ones."""


class EnvOptionError(EnvBuildError, ValueError):
    """An option is unknown to the environment or has a bad value; the message names the accepted ones."""


def _parameters(factory: EnvFactory) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(factory, eval_str=True).parameters.values())
    except (TypeError, ValueError, NameError) as error:
        raise EnvBuildError(f"cannot read the options of {factory!r} from its signature: {error}") from error


def _options(factory: EnvFactory) -> dict[str, inspect.Parameter]:
    """The keyword parameters of `factory`, by name (an empty dict for a factory taking none)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name: p for p in _parameters(factory) if p.kind in kinds}


def _takes_any_keyword(factory: EnvFactory) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in _parameters(factory))


def validate_options(name: str, factory: EnvFactory, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` checked against `factory`'s keyword parameters and converted to their types.

    Raises `EnvOptionError` for an unknown option (naming the accepted ones), a missing required one or
    a value of the wrong type.
    """
    accepted = _options(factory)
    unknown = sorted(set(options) - set(accepted))
    if unknown and not _takes_any_keyword(factory):
        listed = ", ".join(accepted) or "none"
        raise EnvOptionError(
            f"env {name!r} takes no option {', '.join(map(repr, unknown))}; it accepts: {listed}"
        )
    fields: dict[str, Any] = {
        key: (Any if p.annotation is p.empty else p.annotation, ... if p.default is p.empty else p.default)
        for key, p in accepted.items()
    }
    model = create_model(
        "EnvOptions", __config__=ConfigDict(extra="allow", arbitrary_types_allowed=True), **fields
    )
    try:
        checked = model.model_validate(dict(options))
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise EnvOptionError(
            f"env {name!r}: bad options ({problems}); it accepts: {', '.join(accepted)}"
        ) from None
    return {key: getattr(checked, key) for key in options}


def _default(field: dataclasses.Field[Any]) -> Any:
    """A dataclass field's default as a signature shows it (`inspect.Parameter.empty` when it has none)."""
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return inspect.Parameter.empty


def config_factory(make: Callable[[C], E], config: type[C]) -> Callable[..., E]:
    """A factory whose options are the fields of the dataclass `config`: `make(config(**options))`.

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Sizes:
    ...     train: int = 10
    >>> sorted(inspect.signature(config_factory(lambda sizes: sizes, Sizes)).parameters)
    ['train']
    """
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"{config.__name__} is not a dataclass")
    hints = typing.get_type_hints(config)

    def factory(**options: Any) -> E:
        return make(config(**options))

    factory.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=_default(f), annotation=hints[f.name]
            )
            for f in dataclasses.fields(config)
            if f.init
        ]
    )
    factory.__doc__ = f"Build with the fields of {config.__name__} as keyword options."
    return factory


def _import(target: str) -> EnvFactory:
    """The object `module:attribute` names; the current directory is searched first, as `python -m` does,
    so a domain in a file beside the command needs no install."""
    module_name, _, attribute = target.partition(":")
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise UnknownEnv(f"cannot import {module_name!r} for env {target!r}: {error}") from error
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise UnknownEnv(f"module {module_name!r} has no {attribute!r}; name a class or factory in it")
        found = getattr(found, part)
    if not callable(found):
        raise UnknownEnv(f"{target!r} is a {type(found).__name__}; name a DecisionEnv class or a factory")
    return typing.cast(EnvFactory, found)


def check_built(name: str, env: object) -> DecisionEnv:
    """`env` if it has every member of `DecisionEnv`; otherwise an `EnvBuildError` naming the missing ones."""
    missing = [member for member in _PROTOCOL if not hasattr(env, member)]
    if missing:
        raise EnvBuildError(
            f"env {name!r} built a {type(env).__name__}, which lacks {', '.join(missing)}; a DecisionEnv "
            "needs name, system_prompt(), contracts(), tasks(split), episode(task) and expert(task) "
            "(run sessionrl.envs.check_env on it)"
        )
    return typing.cast(DecisionEnv, env)


class Registry:
    """Environment factories by name: registered ones, the built-ins and installed entry points."""

    def __init__(self, built_ins: Iterable[str] = (), *, entry_point_group: str | None = None) -> None:
        self._factories: dict[str, EnvFactory] = {}
        self._pending = list(built_ins)
        self._group = entry_point_group

    def register(self, name: str, factory: EnvFactory) -> None:
        """Add `factory` under `name`; a name is taken once (the same factory again is a no-op)."""
        if not name or ":" in name:
            raise ValueError(
                f"env name {name!r} must be non-empty and hold no ':' (that means module:attribute)"
            )
        held = self._factories.get(name)
        if held is not None and held is not factory:
            raise ValueError(f"env {name!r} is already registered to {held!r}; choose another name")
        self._factories[name] = factory

    def _load_built_ins(self) -> None:
        while self._pending:
            importlib.import_module(self._pending.pop(0))

    def _entry_points(self) -> dict[str, str]:
        if self._group is None:
            return {}
        return {point.name: point.value for point in entry_points(group=self._group)}

    def names(self) -> list[str]:
        """Every known name, sorted: registered, built-in and from installed entry points."""
        self._load_built_ins()
        return sorted({*self._factories, *self._entry_points()})

    def factory(self, name: str) -> EnvFactory:
        """The factory of `name` (a registered or entry-point name, or `module:attribute`)."""
        if ":" in name:
            return _import(name)
        self._load_built_ins()
        if name in self._factories:
            return self._factories[name]
        target = self._entry_points().get(name)
        if target is None:
            raise UnknownEnv(f"no env named {name!r}; known: {', '.join(self.names())}, or give module:Class")
        return _import(target)

    def options(self, name: str) -> tuple[str, ...]:
        """The names of the options `name`'s factory accepts."""
        return tuple(_options(self.factory(name)))

    def validate(self, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """`options` checked and converted for `name` without building it (see `validate_options`)."""
        return validate_options(name, self.factory(name), options)

    def build(self, name: str, /, **options: Any) -> DecisionEnv:
        """The environment `name` built with `options`; an `EnvBuildError` says why it cannot be."""
        factory = self.factory(name)
        return check_built(name, factory(**validate_options(name, factory, options)))


REGISTRY: Final = Registry(BUILT_INS, entry_point_group=ENTRY_POINT_GROUP)
"""The process's registry: the built-ins, `register` calls and installed entry points."""


def register(name: str, factory: EnvFactory) -> None:
    """Add an environment factory to the process's registry (see `Registry.register`)."""
    REGISTRY.register(name, factory)


def build(name: str, /, **options: Any) -> DecisionEnv:
    """Build an environment by registered name or `module:Class` (see `Registry.build`)."""
    return REGISTRY.build(name, **options)


def env_names() -> list[str]:
    """Every environment name the process's registry knows."""
    return REGISTRY.names()
