"""What cannot work says so once, not with a retry loop: a service with no policy backend, and a version
whose artifact went away after it was promoted, fail the step with `retryable: false` (not a 500)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ops_support import make_app, serving
from test_degrade import OPS, open_planned, policy_step

from sessionrl.ops.registry import PolicyRegistry, Stage
from sessionrl.ops.serving import load_hf_policy, route_gateway
from sessionrl.store import SessionStore


async def test_no_policy_backend_is_not_retryable(tmp_path: Path) -> None:
    async with serving(
        make_app(f"sqlite:///{tmp_path / 'ops.db'}", OPS.model_copy(update={"policy": None}))
    ) as client:
        await open_planned(client, "s1")
        answer = await policy_step(client, "s1")
    assert answer["ok"] is False
    assert answer["error_code"] == "POLICY_ERROR"
    assert "no policy backend" in answer["error_message"]
    assert answer["retryable"] is False


async def test_a_version_whose_artifact_vanished_fails_its_steps_without_retry(
    tmp_path: Path, artifacts: dict[str, str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    folder = tmp_path / "v1"
    shutil.copytree(artifacts["a"], folder)
    with SessionStore.open(url) as store:
        registry = PolicyRegistry(store, check=load_hf_policy)
        registry.register("support", str(folder))
        registry.promote("support", 1, Stage.PRODUCTION, reason="first")
    shutil.rmtree(folder)  # gone after promotion: only serving can find out now
    app = make_app(url, OPS)
    route_gateway(app)
    async with serving(app) as client:
        await open_planned(client, "s1")
        answer = await policy_step(client, "s1")
        chat = await client.post(
            "/gateway/sessions/g1/v1/chat/completions",
            json={"model": "support", "messages": [{"role": "user", "content": "refund #1"}]},
        )
    assert answer["ok"] is False
    assert answer["error_code"] == "POLICY_ERROR"
    assert "support@v1 does not load" in answer["error_message"]
    assert answer["retryable"] is False
    assert chat.status_code == 503, chat.text  # said plainly, not a 500
    assert "support@v1 does not load" in chat.text
