"""The policies API and CLI: statuses of bad stage changes and unknown versions, idempotency keys, and the
CLI commands over the same store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ops_support import TOKEN, make_app, serving
from typer.testing import CliRunner

from sessionrl.cli import app as cli
from sessionrl.ops.config import OpsConfig


async def test_the_api_registers_promotes_and_answers_with_named_statuses(
    tmp_path: Path, artifacts: dict[str, str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    async with serving(make_app(url, OpsConfig(policy="orders"))) as client:
        key = {"Idempotency-Key": "reg-1"}
        a = {"artifact": artifacts["a"]}
        first = await client.post("/v1/policies/orders/versions", json=a, headers=key)
        again = await client.post("/v1/policies/orders/versions", json=a, headers=key)
        assert (first.status_code, again.status_code) == (201, 201)
        assert again.json() == first.json()
        assert first.json()["stage"] == "candidate"
        promote = "/v1/policies/orders/versions/1/promote"
        assert (await client.post(promote, json={"to": "production"})).json()["stage"] == "production"
        assert (await client.post(promote, json={"to": "canary"})).status_code == 409  # production → canary
        assert (
            await client.post("/v1/policies/orders/versions/7/promote", json={"to": "canary"})
        ).status_code == 404
        await client.post("/v1/policies/orders/versions", json={"artifact": artifacts["b"]})
        canary = await client.post("/v1/policies/orders/versions/2/promote", json={"to": "canary"})
        assert canary.json()["share"] == 0.05  # the config's default share
        assert (await client.post("/v1/policies/orders/rollback", json={})).status_code == 422  # no reason
        rolled = await client.post("/v1/policies/orders/rollback", json={"reason": "drill"})
        assert rolled.json()["version"] == 1
        listed = (await client.get("/v1/policies", params={"policy": "orders"})).json()
        assert [(v["version"], v["stage"]) for v in listed] == [(1, "production"), (2, "retired")]
        compared = (await client.get("/v1/policies/orders/compare", params={"a": 1, "b": 2})).json()
        assert (compared["n_a"], compared["n_b"]) == (0, 0)
        kinds = [e["kind"] for e in (await client.get("/v1/policies/log")).json()]
        assert kinds.count("rolled_back") == 1


async def test_a_time_outside_the_store_s_range_is_a_422_not_a_server_error(tmp_path: Path) -> None:
    """The store keeps times in UTC, where an offset can push year 9999 (or year 1) out of range; the chaos
    fuzzer found the compare route answering 500 there."""
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    async with serving(make_app(url, OpsConfig(policy="orders"))) as client:
        for route, params in [
            ("/v1/policies/orders/compare", {"a": 1, "b": 2, "since": "9999-12-31T23:59:59-23:59"}),
            ("/v1/policies/orders/compare", {"a": 1, "b": 2, "until": "0001-01-01T00:00:00+23:00"}),
            ("/v1/sessions", {"created_after": "9999-12-31T23:59:59-23:59"}),
        ]:
            answer = await client.get(route, params=params)
            assert answer.status_code == 422, (route, answer.text)
            assert "out of range" in answer.text
        ok = {"a": 1, "b": 2, "since": "9999-12-31T23:59:59+01:00"}
        assert (await client.get("/v1/policies/orders/compare", params=ok)).status_code == 200


def test_the_cli_manages_versions_and_the_switch(tmp_path: Path, artifacts: dict[str, str]) -> None:
    db = f"sqlite:///{tmp_path / 'ops.db'}"
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(cli, [*args, "--db", db])
        assert result.exit_code == 0, result.output
        return result.output

    assert "registered orders v1" in run(
        "policies", "register", "orders", artifacts["a"], "--run-dir", "runs/a"
    )
    run("policies", "register", "orders", artifacts["b"])
    assert "orders v1 is production" in run("policies", "promote", "orders", "1")
    assert "on 20% of sessions" in run("policies", "promote", "orders", "2", "--canary", "0.2")
    rows = [json.loads(line) for line in run("policies", "list", "--json").splitlines()]
    assert [(r["version"], r["stage"], r["share"]) for r in rows] == [
        (1, "production", 0.0),
        (2, "canary", 0.2),
    ]
    assert json.loads(run("policies", "show", "orders", "1"))["lineage"]["run_dir"] == "runs/a"
    assert "success" in run("policies", "compare", "orders", "1", "2")
    assert "strategy_mode: rules" in run("policies", "strategy", "rules", "--reason", "drill")
    assert "strategy_mode: rules" in run("policies", "strategy")
    assert "serves production" in run("policies", "rollback", "orders", "--reason", "worse")
    failed = runner.invoke(cli, ["policies", "promote", "orders", "2", "--db", db])
    assert failed.exit_code == 1
    assert "retired" in failed.output


async def test_the_dashboard_shows_versions_parked_sessions_and_the_log(
    tmp_path: Path, artifacts: dict[str, str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    async with serving(make_app(url, OpsConfig(policy="orders"))) as client:
        await client.post(
            "/v1/policies/orders/versions", json={"artifact": artifacts["a"], "lineage": {"note": "first"}}
        )
        await client.post("/v1/policies/orders/versions/1/promote", json={"to": "production"})
        await client.put("/v1/policies/strategy", json={"mode": "rules", "reason": "drill"})
        login = await client.post("/ui/login", data={"token": TOKEN, "next": "/ui/policies"})
        assert login.status_code == 303
        html = (await client.get("/ui/policies", cookies=login.cookies)).text
        assert '<b class="mode">rules</b>' in html
        assert artifacts["a"] in html
        assert "first" in html
        assert "drill" in html  # the switch's log line
        only = (await client.get("/ui/policies", params={"kind": "stage"}, cookies=login.cookies)).text
        assert "drill" not in only


async def test_an_artifact_that_does_not_load_is_refused_on_register_and_promote(
    tmp_path: Path, artifacts: dict[str, str]
) -> None:
    """`register` loads the artifact as serving will; `promote` refuses one deleted since: a 422 naming it,
    and nothing changes (before, both were accepted and every step then failed with a 500)."""
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    doomed = tmp_path / "doomed"
    shutil.copytree(artifacts["a"], doomed)
    async with serving(make_app(url, OpsConfig(policy="orders"))) as client:
        missing = await client.post("/v1/policies/orders/versions", json={"artifact": artifacts["gone"]})
        assert missing.status_code == 422, missing.text
        assert artifacts["gone"] in missing.text
        assert (await client.get("/v1/policies")).json() == []
        made = await client.post("/v1/policies/orders/versions", json={"artifact": str(doomed)})
        assert made.status_code == 201, made.text
        shutil.rmtree(doomed)
        promoted = await client.post("/v1/policies/orders/versions/1/promote", json={"to": "production"})
        assert promoted.status_code == 422, promoted.text
        assert "doomed" in promoted.text
        assert (await client.get("/v1/policies")).json()[0]["stage"] == "candidate"


def test_the_cli_refuses_an_artifact_that_does_not_load(tmp_path: Path, artifacts: dict[str, str]) -> None:
    db = f"sqlite:///{tmp_path / 'ops.db'}"
    runner = CliRunner()
    refused = runner.invoke(cli, ["policies", "register", "orders", artifacts["gone"], "--db", db])
    assert refused.exit_code == 1
    assert "cannot serve orders" in refused.output
    not_a_model = tmp_path / "notes"
    not_a_model.mkdir()
    refused = runner.invoke(cli, ["policies", "register", "orders", str(not_a_model), "--db", db])
    assert refused.exit_code == 1
    assert "config.json missing" in " ".join(refused.output.split())
