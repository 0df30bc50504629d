"""Command-line flags made from a pydantic config's fields.

A command lists which fields it exposes (`FieldFlag`); `with_field_flags` adds one typer option per
field to the command, typed, described and defaulted by the field itself, and hands the command the
values a person gave as one nested mapping of field settings, ready to merge over a config file's. The
config validates them: a value it refuses is reported against the flag that gave it (`refused`).

A field holding a nested model (such as `ops`) is set from a YAML file whose mapping fills that model.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import typer
import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

SETTINGS = "given_settings"
"""The keyword through which a decorated command receives the settings its flags gave."""


@dataclass(frozen=True)
class FieldFlag:
    """The option `--param` (underscores as dashes) setting the field at `path`, dotted through nested
    models (`orchestrator.cache_size`); `note` is added to the field's own description."""

    param: str
    path: str
    note: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.param.replace("_", "-")


def field_info(model: type[BaseModel], path: str) -> FieldInfo:
    """The field at the dotted `path` of `model`; `KeyError` naming the path when there is none."""
    *parents, name = path.split(".")
    for parent in parents:
        nested = model.model_fields[parent].annotation
        if not (isinstance(nested, type) and issubclass(nested, BaseModel)):
            raise KeyError(f"{path}: {parent} is not a nested model")
        model = nested
    if name not in model.model_fields:
        raise KeyError(f"{model.__name__} has no field {name!r} ({path})")
    return model.model_fields[name]


def help_of(info: FieldInfo, note: str) -> str:
    """The flag's help: the field's description, `note`, and the field's default when it has one worth
    showing (escaped from rich's markup, which the CLI's help renders)."""
    text = " ".join(filter(None, (info.description, note)))
    default = info.get_default(call_default_factory=True)
    if default is None or isinstance(default, BaseModel):
        return text
    return f"{text} \\[default: {default}]"


def bare_type(info: FieldInfo) -> Any:
    """The field's type without `None`."""
    annotation = info.annotation
    if get_origin(annotation) in (Union, types.UnionType):
        return next(arg for arg in get_args(annotation) if arg is not type(None))
    return annotation


def holds_model(info: FieldInfo) -> bool:
    """Whether the field holds a nested model (its flag then takes a YAML file)."""
    kind = bare_type(info)
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def parameter(model: type[BaseModel], flag: FieldFlag) -> inspect.Parameter:
    """The keyword parameter typer reads the option from (None when not given)."""
    info = field_info(model, flag.path)
    help_text = help_of(info, flag.note)
    kind = Path if holds_model(info) else bare_type(info)
    if holds_model(info):
        help_text += " A YAML file of its settings."
    option = typer.Option(flag.flag, help=help_text, show_default=False)
    return inspect.Parameter(
        flag.param, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[kind | None, option]
    )


def settings_from(
    model: type[BaseModel], flags: Iterable[FieldFlag], given: Mapping[str, Any]
) -> dict[str, Any]:
    """The nested field settings of the flags given (not None); a nested model's file is read."""
    settings: dict[str, Any] = {}
    for flag in flags:
        value = given.get(flag.param)
        if value is None:
            continue
        if holds_model(field_info(model, flag.path)):
            value = yaml_mapping(value, flag.flag)
        *parents, name = flag.path.split(".")
        place = settings
        for parent in parents:
            place = place.setdefault(parent, {})
        place[name] = value
    return settings


def is_set(settings: Mapping[str, Any], path: str) -> bool:
    """Whether the nested `settings` hold a value at the dotted `path`."""
    place: Any = settings
    for part in path.split("."):
        if not isinstance(place, Mapping) or part not in place:
            return False
        place = place[part]
    return True


def yaml_mapping(path: Path, flag: str) -> dict[str, Any]:
    """The mapping the YAML file `path` holds (empty for an empty file); `BadParameter` otherwise."""
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise typer.BadParameter(f"{path} must hold a mapping of settings", param_hint=flag)
    return {str(key): value for key, value in loaded.items()}


def with_field_flags(
    model: type[BaseModel], flags: tuple[FieldFlag, ...]
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Add an option per flag to a typer command, which receives what they set as `given_settings`."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != SETTINGS]
        added = [parameter(model, flag) for flag in flags]

        @functools.wraps(command)
        def run(**values: Any) -> None:
            given = {flag.param: values.pop(flag.param, None) for flag in flags}
            command(**values, **{SETTINGS: settings_from(model, flags, given)})

        run.__signature__ = signature.replace(parameters=own + added)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in own + added}
        del run.__wrapped__  # typer reads the signature above, not the command's
        return run

    return decorate


def refused(
    error: ValidationError, flags: tuple[FieldFlag, ...], given: Mapping[str, Any], source: str
) -> typer.BadParameter:
    """The config's first complaint, named by the flag that set the field when one did (`given`: the
    settings the flags gave), else by `source`, where the other settings came from."""
    first = error.errors()[0]
    path = ".".join(str(part) for part in first["loc"])
    blamed = (f.flag for f in flags if is_set(given, f.path) and (path + ".").startswith(f.path + "."))
    return typer.BadParameter(f"{path}: {first['msg']}", param_hint=next(blamed, source))
