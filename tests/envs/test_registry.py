"""The env registry: names, `module:Class`, entry points, and options checked against each factory."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from sessionrl.envs import EnvBuildError, EnvOptionError, Registry, Split, UnknownEnv, build, config_factory
from sessionrl.envs import registry as registry_module
from sessionrl.envs.orders import OrdersEnv


def orders(*, seed: int = 0, train: int = 4, data: Path | None = None) -> OrdersEnv:
    """A factory with typed keyword options (`data` is only there to be checked)."""
    return build("orders", seed=seed, train=train, dev=1, test=1)


def test_a_registered_factory_builds_with_checked_options() -> None:
    envs = Registry()
    envs.register("tiny", orders)
    env = envs.build("tiny", train="3", data="somewhere")  # strings from a command line are converted
    assert (env.name, len(env.tasks(Split.TRAIN))) == ("orders", 3)
    assert envs.validate("tiny", {"data": "x"}) == {"data": Path("x")}
    assert envs.options("tiny") == ("seed", "train", "data")
    assert envs.names() == ["tiny"]


def test_unknown_options_and_bad_values_name_what_is_accepted() -> None:
    envs = Registry()
    envs.register("tiny", orders)
    with pytest.raises(EnvOptionError, match=r"takes no option 'size', 'x'; it accepts: seed, train, data"):
        envs.build("tiny", size=3, x=1)
    with pytest.raises(EnvOptionError, match=r"'tiny': bad options \(train: Input should be a valid integer"):
        envs.build("tiny", train="many")


def test_unknown_names_list_the_known_ones() -> None:
    envs = Registry()
    envs.register("b", orders)
    envs.register("a", orders)
    with pytest.raises(UnknownEnv, match=r"no env named 'c'; known: a, b, or give module:Class"):
        envs.build("c")
    with pytest.raises(ValueError, match="already registered"):
        envs.register("a", OrdersEnv)
    envs.register("a", orders)  # the same factory again changes nothing
    with pytest.raises(ValueError, match="hold no ':'"):
        envs.register("a:b", orders)


def test_module_and_class_names_need_no_registration() -> None:
    env = Registry().build("sessionrl.envs.orders:OrdersEnv")
    assert env.name == "orders"
    with pytest.raises(UnknownEnv, match="cannot import 'no_such_module'"):
        Registry().build("no_such_module:Env")
    with pytest.raises(UnknownEnv, match=r"module 'sessionrl\.envs\.orders' has no 'Missing'"):
        Registry().build("sessionrl.envs.orders:Missing")
    with pytest.raises(UnknownEnv, match="is a tuple; name a DecisionEnv class or a factory"):
        Registry().build("sessionrl.envs.orders:RISK_FLAGS")


def test_something_that_is_not_an_environment_is_refused_with_the_fix() -> None:
    envs = Registry()
    envs.register("thing", object)
    with pytest.raises(EnvBuildError, match=r"built a object, which lacks name, system_prompt, contracts"):
        envs.build("thing")
    envs.register("dict", dict)
    with pytest.raises(EnvBuildError, match="cannot read the options of <class 'dict'>"):
        envs.build("dict")


def test_installed_packages_add_environments_through_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    points = [EntryPoint("shop", "sessionrl.envs.orders:OrdersEnv", "sessionrl.envs")]
    monkeypatch.setattr(
        registry_module, "entry_points", lambda group: points if group == "sessionrl.envs" else []
    )
    envs = Registry(entry_point_group="sessionrl.envs")
    assert envs.names() == ["shop"]
    assert envs.build("shop").name == "orders"
    assert "shop" in registry_module.env_names()


def test_the_built_ins_are_registered() -> None:
    assert {"clinic", "orders", "retail"} <= set(registry_module.env_names())
    assert build("orders", train=2, dev=0, test=0).tasks(Split.DEV) == ()
    with pytest.raises(EnvOptionError, match="it accepts: seed, train, dev, test, time_factor"):
        build("clinic", data="x")


def test_config_factory_takes_the_fields_of_a_config_dataclass() -> None:
    @dataclass(frozen=True)
    class Sizes:
        train: int = 5
        dev: int = 0

    envs = Registry()
    envs.register(
        "sized",
        config_factory(lambda sizes: build("orders", train=sizes.train, dev=sizes.dev, test=0), Sizes),
    )
    assert envs.options("sized") == ("train", "dev")
    assert len(envs.build("sized", train="2").tasks(Split.TRAIN)) == 2
    with pytest.raises(TypeError, match="is not a dataclass"):
        config_factory(OrdersEnv, int)


def test_module_class_names_are_found_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = "from sessionrl.envs import build\n\n\ndef make():\n    return build('orders', train=2)\n"
    (tmp_path / "shop_here.py").write_text(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert len(build("shop_here:make").tasks(Split.TRAIN)) == 2
    sys.modules.pop("shop_here", None)
