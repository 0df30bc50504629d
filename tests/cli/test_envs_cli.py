"""`sessionrl envs ...` driven through typer's runner: list, show, run-expert and replay-gold."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner, Result

from sessionrl.cli import app
from sessionrl.envs import registry
from sessionrl.envs.retail import DATA_ENV_VAR
from sessionrl.episodes.verdict import task_success
from sessionrl.store import SessionStore

runner = CliRunner()


@pytest.fixture(autouse=True)
def no_data_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test says where the retail data is; the caller's environment never does."""
    monkeypatch.delenv(DATA_ENV_VAR, raising=False)
    monkeypatch.delenv("SESSIONRL_DB", raising=False)


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, ["envs", *args], env=env)


def last_json(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    summary: dict[str, Any] = orjson.loads(result.stdout.strip().splitlines()[-1])
    return summary


def test_list_shows_every_built_in_with_its_task_counts(retail_data: Path) -> None:
    result = run("list", "--data", str(retail_data))
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 2}
    assert sorted(rows) == ["clinic", "orders", "retail"]
    assert [cell.strip() for cell in rows["retail"].split("│")[2:6]] == ["16", "500", "20", "115"]


def rows_of(result: Result) -> dict[str, str]:
    """The table's rows by env name, each row's wrapped lines joined."""
    assert result.exit_code == 0, result.output
    rows: dict[str, str] = {}
    name = ""
    for line in result.stdout.splitlines():
        if line.count("│") > 2:
            cells = [cell.strip() for cell in line.split("│")[1:-1]]
            name = cells[0] or name
            rows[name] = " ".join(filter(None, [rows.get(name, ""), *cells[1:]]))
    return rows


def test_list_without_retail_data_says_how_to_give_it() -> None:
    rows = rows_of(run("list"))
    assert rows["retail"] == f"- - - - no data: pass --data retail=DIR or set {DATA_ENV_VAR}"
    assert rows["orders"] == "8 400 50 100"


def test_list_data_goes_to_the_domain_it_names(tmp_path: Path) -> None:
    (tmp_path / "users.json").write_text("{}")
    rows = rows_of(run("list", "--data", f"retail={tmp_path}"))
    said = f"- - - - retail data folder {tmp_path} lacks orders.json, products.json, tools.json, wiki.md " + (
        "and a task file (tasks_train.json, tasks_dev.json or tasks_test.json; one is enough)"
    )
    assert rows["retail"].replace(" ", "") == said.replace(" ", "")  # a long path folds across lines
    result = run("list", "--data", str(tmp_path))  # a bare folder that is not retail's
    assert rows_of(result)["retail"] == f"- - - - no data: pass --data retail=DIR or set {DATA_ENV_VAR}"
    assert f"--data {tmp_path} holds the files of none of them; name one: --data NAME=DIR" in result.stderr
    assert rows_of(run("list", "--data", f"orders={tmp_path}"))["orders"] == (
        "- - - - takes no data folder; --data orders=... is not used"
    )
    result = run("list", "--data", f"shop={tmp_path}")
    assert result.exit_code == 2
    assert "no env named shop; known: clinic, orders, retail" in result.output


def test_check_runs_check_env_on_a_built_in() -> None:
    result = run("check", "orders", "--tasks", "1")
    assert result.exit_code == 0, result.output
    assert "orders passes check_env: 8 skills, 3 tasks checked (of 400 train, 50 dev, 100 test)" in (
        result.stdout
    )


def test_show_prints_contracts_policy_and_a_sample_task(retail_data: Path) -> None:
    result = run("show", "retail", "--data", str(retail_data))
    assert result.exit_code == 0, result.output
    assert "16 skills; tasks: 500 train, 20 dev, 115 test" in result.stdout
    assert "cancel_pending_order" in result.stdout
    assert "# Retail agent policy" in result.stdout
    assert "sample task retail-train-0" in result.stdout
    assert "find_user_id_by_name_zip" in result.stdout


def test_a_missing_retail_folder_is_an_error_that_says_how_to_get_it(tmp_path: Path) -> None:
    result = run("run-expert", "retail", "--n", "1", "--db", "sqlite://")
    assert result.exit_code == 1
    assert "no retail data folder given" in result.stderr
    assert f"Pass --data DIR or set {DATA_ENV_VAR}=DIR" in result.stderr
    result = run("replay-gold", "retail", "--data", str(tmp_path), "--db", "sqlite://")
    assert result.exit_code == 1
    assert f"retail data folder {tmp_path} lacks users.json" in result.stderr


def test_run_expert_stores_the_sessions_and_ends_with_a_json_summary(
    retail_data: Path, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'runs' / 'sessions.db'}"
    args = ["run-expert", "retail", "--split", "train", "--n", "3", "--db", db, "--no-progress"]
    summary = last_json(run(*args, env={DATA_ENV_VAR: str(retail_data)}))
    assert {k: summary[k] for k in ("env", "split", "agent", "n")} == {
        "env": "retail",
        "split": "train",
        "agent": "expert",
        "n": 3,
    }
    with SessionStore.open(db) as store:
        sessions = list(store.iter_sessions())
    assert len(sessions) == 3
    assert summary["successes"] == sum(task_success(s) is True for s in sessions)
    assert summary["success_rate"] == summary["successes"] / 3
    assert summary["success_rate"] == 1.0  # the first three train tasks name each tool once


def test_run_expert_on_a_simulated_domain() -> None:
    summary = last_json(run("run-expert", "orders", "--n", "4", "--db", "sqlite://", "--no-progress"))
    assert (summary["env"], summary["n"], summary["success_rate"]) == ("orders", 4, 1.0)


def test_replay_gold_reports_on_the_test_split(retail_data: Path, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'gold.db'}"
    args = ["replay-gold", "retail", "--n", "2", "--data", str(retail_data), "--db", db, "--no-progress"]
    summary = last_json(run(*args))
    assert (summary["env"], summary["split"], summary["agent"], summary["n"]) == ("retail", "test", "gold", 2)
    with SessionStore.open(db) as store:
        sessions = list(store.iter_sessions())
    assert sorted(s.metadata["task_id"] for s in sessions) == ["retail-test-0", "retail-test-1"]
    unsolved = sorted(s.metadata["task_id"] for s in sessions if task_success(s) is not True)
    assert sorted(summary["failed"]) == unsolved
    assert summary["success_rate"] == (2 - len(unsolved)) / 2


def test_replay_gold_refuses_a_domain_without_gold_actions() -> None:
    result = run("replay-gold", "orders", "--db", "sqlite://")
    assert result.exit_code == 1
    assert "orders has no gold actions" in result.stderr


def test_options_reach_the_environment_and_wrong_ones_are_named() -> None:
    summary = last_json(run("run-expert", "orders", "-o", "train=3", "--db", "sqlite://", "--no-progress"))
    assert (summary["n"], summary["success_rate"]) == (3, 1.0)
    result = run("show", "orders", "--data", "somewhere")
    assert result.exit_code == 1
    assert "env 'orders' takes no option 'data'; it accepts: seed, train, dev, test" in result.stderr
    result = run("show", "orders", "-o", "train")
    assert result.exit_code == 2
    assert "is not KEY=VALUE" in result.output


def test_an_unknown_environment_lists_the_known_ones() -> None:
    result = run("show", "shop")
    assert result.exit_code == 1
    assert "no env named 'shop'; known: clinic, orders, retail, or give module:Class" in result.stderr


def test_list_shows_environments_of_installed_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    points = [
        EntryPoint("shop", "sessionrl.envs.orders:OrdersEnv", "sessionrl.envs"),
        EntryPoint("broken", "no_such_package:Env", "sessionrl.envs"),
    ]
    monkeypatch.setattr(registry, "entry_points", lambda group: points)
    result = run("list")
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 2}
    assert sorted(name for name in rows if name) == ["broken", "clinic", "orders", "retail", "shop"]
    assert [cell.strip() for cell in rows["shop"].split("│")[2:6]] == ["8", "400", "50", "100"]
    assert "cannot import" in rows["broken"]
