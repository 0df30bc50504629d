"""A τ-bench-style domain made of a data folder, three tools and an expert: it passes `check_env`, and its
gold actions replay at 1.0 through `sessionrl envs replay-gold module:Class`."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from library_domain import DATA, LibraryEnv, borrow_book, find_member
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.envs import EnvBuildError, ExpertPlan, ExpertStep, Split, Task, check_env, replay, run_plan
from sessionrl.envs.taubench import SHARED_ERRORS, SHARED_TOOLS, TauEnv, calculate, gold_plan

runner = CliRunner()


@pytest.fixture(scope="module")
def env() -> LibraryEnv:
    return LibraryEnv(DATA)


def test_the_domain_passes_check_env(env: LibraryEnv) -> None:
    assert check_env(env) == ()
    assert [len(env.tasks(split)) for split in Split] == [3, 1, 2]
    assert env.tasks(Split.TEST)[1].task_id == "library-test-1"
    contracts = {c.name: c for c in env.contracts()}
    assert (contracts["borrow_book"].risk, contracts["get_book"].risk) == ("high", "low")
    assert sorted(contracts["borrow_book"].errors) == ["NOT_FOUND", "UNAVAILABLE"]


def test_a_domain_with_only_a_test_split_passes_check_env(tmp_path: Path) -> None:
    env = LibraryEnv(only_test_split(tmp_path))
    assert [len(env.tasks(split)) for split in Split] == [0, 0, 2]
    assert check_env(env) == ()


def test_success_needs_the_gold_state_and_every_output(env: LibraryEnv) -> None:
    task = env.tasks(Split.TRAIN)[1]  # two loans, and the title said
    assert replay(env.episode(task), env.gold_plan(task))
    episode = env.episode(task)
    borrow_book(episode.db, member_id="m2", book_id="b2")
    assert episode.outcome(["Solaris is yours"]).checks == {"state": False, "outputs": True}
    borrow_book(episode.db, member_id="m2", book_id="b1")
    assert episode.outcome(["Here you are"]).checks == {"state": True, "outputs": False}
    assert episode.success(["SOLARIS, and Dune"])


def test_a_failing_gold_action_leaves_the_gold_state_unchanged(env: LibraryEnv) -> None:
    task = env.tasks(Split.TRAIN)[2]  # Neuromancer has no copy on the shelf
    assert env.gold_hash(task) == env.episode(task).state_hash()
    plan = env.expert(task)
    assert "I could not lend you book b3" in plan.final_message
    assert replay(env.episode(task), plan)


def test_the_default_expert_replays_the_gold_actions(env: LibraryEnv) -> None:
    class Plain(LibraryEnv):
        expert = TauEnv.expert

    plain = Plain(DATA)
    for task in plain.tasks(Split.TRAIN):
        plan = plain.expert(task)
        assert [step.tool for step in plan.steps] == [action["name"] for action in task.payload["actions"]]
        assert replay(plain.episode(task), plan)


def test_gold_plan_says_every_output(env: LibraryEnv) -> None:
    plan = gold_plan(env.tasks(Split.TEST)[1])
    assert [step.tool for step in plan.steps] == ["borrow_book"]
    assert plan.final_message == "2"


def test_tools_and_their_schemas_must_agree(tmp_path: Path) -> None:
    class Missing(LibraryEnv):
        tools = (find_member, borrow_book)

    with pytest.raises(EnvBuildError, match=r"tools.json names \['get_book'\] without a function"):
        Missing(DATA)

    class Unexplained(LibraryEnv):
        errors: ClassVar[dict[str, str]] = {"NOT_FOUND": "No such member or book."}

    with pytest.raises(
        EnvBuildError, match=r"borrow_book raises \['UNAVAILABLE'\]; give each code a meaning"
    ):
        Unexplained(DATA)

    folder = tmp_path / "library"
    shutil.copytree(DATA, folder)
    tasks = orjson.loads((folder / "tasks_dev.json").read_bytes())
    tasks[0]["actions"][0]["name"] = "burn_book"
    (folder / "tasks_dev.json").write_bytes(orjson.dumps(tasks))
    with pytest.raises(EnvBuildError, match=r"library-dev-0's gold actions call \['burn_book'\]"):
        LibraryEnv(folder)

    class Nameless(TauEnv):
        tables = ("members",)

    with pytest.raises(EnvBuildError, match="Nameless must set name, tools"):
        Nameless(DATA)


def replay_gold(*args: str) -> dict[str, Any]:
    result = runner.invoke(
        app, ["envs", "replay-gold", "library_domain:LibraryEnv", "--data", str(DATA), *args]
    )
    assert result.exit_code == 0, result.output
    summary: dict[str, Any] = orjson.loads(result.stdout.strip().splitlines()[-1])
    return summary


@pytest.mark.parametrize("split", list(Split))
def test_gold_actions_replay_at_one_through_the_cli(split: Split, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'gold.db'}"
    summary = replay_gold("--split", split.value, "--db", db, "--no-progress")
    assert (summary["env"], summary["agent"], summary["n"]) == (
        "library",
        "gold",
        [3, 1, 2][list(Split).index(split)],
    )
    assert summary["success_rate"] == 1.0
    assert summary["failed"] == []


def test_the_cli_shows_the_domain_and_runs_its_expert() -> None:
    shown = runner.invoke(app, ["envs", "show", "library_domain:LibraryEnv", "--data", str(DATA)])
    assert shown.exit_code == 0, shown.output
    assert "library: 3 skills; tasks: 3 train, 1 dev, 2 test" in shown.stdout
    assert "# Library desk policy" in shown.stdout
    args = ["envs", "run-expert", "library_domain:LibraryEnv", "--data", str(DATA), "--db", "sqlite://"]
    ran = runner.invoke(app, [*args, "--no-progress"])
    assert ran.exit_code == 0, ran.output
    assert orjson.loads(ran.stdout.strip().splitlines()[-1])["success_rate"] == 1.0


class WithSharedTools(LibraryEnv):
    tools = (*SHARED_TOOLS, *LibraryEnv.tools)
    errors: ClassVar[dict[str, str]] = {**SHARED_ERRORS, **LibraryEnv.errors}


def test_a_domain_includes_the_shared_tools_with_their_schemas_and_examples() -> None:
    env = WithSharedTools(DATA)  # its tools.json describes only the library's own three tools
    assert check_env(env) == ()
    contracts = {c.name: c for c in env.contracts()}
    assert contracts["calculate"].examples == ({"expression": "(1 + 2) * 3.5"},)
    assert sorted(contracts["calculate"].errors) == ["INVALID_ARGUMENT"]
    assert contracts["think"].description.startswith("Write down a thought; nothing in the database changes")
    assert contracts["transfer_to_human_agents"].risk == "low"
    episode = env.episode(env.tasks(Split.TEST)[0])
    assert calculate(episode.db, expression="2 * (3 + 4.5)") == {"result": 15.0}
    hand_off = ExpertPlan(
        "hand over", (ExpertStep("s1", "ask a person", "transfer_to_human_agents", {"summary": "x"}),), ""
    )
    assert not episode.terminated
    asyncio.run(run_plan(episode, hand_off))
    assert episode.terminated  # `ends_episode=True`


def test_only_a_test_split_runs_by_default_and_another_split_is_refused_by_name(tmp_path: Path) -> None:
    folder = only_test_split(tmp_path)
    args = ["library_domain:LibraryEnv", "--data", str(folder), "--db", "sqlite://", "--no-progress"]
    for command in ("run-expert", "replay-gold"):
        ran = runner.invoke(app, ["envs", command, *args])
        assert ran.exit_code == 0, ran.output
        summary = orjson.loads(ran.stdout.strip().splitlines()[-1])
        assert (summary["split"], summary["n"], summary["success_rate"]) == ("test", 2, 1.0)
        refused = runner.invoke(app, ["envs", command, *args, "--split", "train"])
        assert refused.exit_code == 1
        assert "library has no train tasks (its tasks: 2 test); pass --split test" in refused.stderr


def test_envs_check_passes_the_domain_and_says_how_to_fix_a_broken_one() -> None:
    args = ["envs", "check", "library_domain:LibraryEnv", "--data", str(DATA)]
    passed = runner.invoke(app, args)
    assert passed.exit_code == 0, passed.output
    assert "library passes check_env: 3 skills, 6 tasks checked (of 3 train, 1 dev, 2 test)" in passed.stdout
    args[2] = "test_taubench_domain:SilentExpert"
    failed = runner.invoke(app, args)
    assert failed.exit_code == 1
    assert (
        "check failed: env 'library': the expert plan of library-train-1 does not solve it" in failed.stderr
    )
    assert "fix expert()" in failed.stderr


class SilentExpert(LibraryEnv):
    """Its expert never says the outputs the tasks expect."""

    def expert(self, task: Task) -> ExpertPlan:
        plan = super().expert(task)
        return ExpertPlan(plan.goal, plan.steps, "Done.")


def only_test_split(tmp_path: Path) -> Path:
    """A copy of the library's data with only its test split."""
    folder = tmp_path / "test-only"
    shutil.copytree(DATA, folder)
    for split in ("train", "dev"):
        (folder / f"tasks_{split}.json").unlink()
    return folder
