"""An exported structured policy loads back with its options: graph state, quantile critic, prototypes."""

from __future__ import annotations

from pathlib import Path

import torch

from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.policy.structured import policy_step
from sessionrl.train.structured.rollout import StructuredRunConfig, build_run
from sessionrl.train.structured.run import export_policy, load_policy, run_prototypes


def test_a_policy_with_every_option_round_trips(tmp_path: Path) -> None:
    env = OrdersEnv(DomainConfig(train=24, dev=0, test=0, time_factor=0, transient_failures=False))
    run = StructuredRunConfig(
        num_envs=2, hidden=16, seed=2, state="graph", risk_quantiles=4, prototypes=3, cvar_alpha=0.5
    )
    policy, _, collector = build_run(env, run)
    export_policy(policy, tmp_path / "p")
    loaded, encoder = load_policy(env, run, tmp_path / "p")
    assert len(run_prototypes(env, run)) == 3
    assert loaded.layout == policy.layout
    out, _, _ = policy_step(policy, collector.obs, collector.text)
    again, _, _ = policy_step(loaded, collector.obs, collector.text)
    collector.close()
    assert torch.equal(out.dist.skill_logits, again.dist.skill_logits)
    assert again.risk_quantiles is not None
    assert torch.equal(out.risk_value, again.risk_value)
    assert encoder.dim == run.text_dim
