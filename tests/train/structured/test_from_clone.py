"""What keeps RL from losing its clone's ground: the critic warm-up, the anchor to the start policy and the
refitted σ of the clone's number heads."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch

from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.policy.structured import LOG_STD_RANGE, StructuredAction, StructuredPolicy
from sessionrl.train.structured.aaac import AAACConfig, kl_penalised, train_aaac
from sessionrl.train.structured.imitation import Demonstrations, refit_log_std
from sessionrl.train.structured.ppo import Anchor, PPOConfig, UpdateConfig, train_ppo
from sessionrl.train.structured.rollout import IterationLog, StructuredRunConfig, build_run

RUN = StructuredRunConfig(iterations=2, num_envs=2, rollout_steps=16, seed=3)


@pytest.fixture(scope="module")
def env() -> OrdersEnv:
    return OrdersEnv(DomainConfig(train=24, dev=0, test=0, time_factor=0, transient_failures=False))


@pytest.fixture(scope="module")
def start(env: OrdersEnv) -> StructuredPolicy:
    policy, _, collector = build_run(env, RUN)
    collector.close()
    return policy


def actor(policy: StructuredPolicy) -> dict[str, torch.Tensor]:
    """The parameters that choose actions (everything but the critics)."""
    return {
        name: value
        for name, value in policy.state_dict().items()
        if not name.startswith(("critic.", "value_head.", "risk_head."))
    }


def test_warmup_rounds_train_the_critics_alone(env: OrdersEnv, start: StructuredPolicy) -> None:
    """Two warm-up rounds out of two: the actor is exactly the start policy's, the value head moved, and
    no penalty weight was ever in force."""
    update = UpdateConfig(epochs=1, minibatches=2, critic_warmup=2, anchor_coef=1.0)
    logs: list[IterationLog] = []
    trained = train_ppo(env, PPOConfig(run=RUN, update=update), policy=start, on_log=logs.append)
    for name, value in actor(start).items():
        torch.testing.assert_close(actor(trained.policy)[name], value, rtol=0, atol=0, msg=name)
    assert not torch.allclose(trained.policy.value_head.weight, start.value_head.weight)
    assert [log.anchor_coef for log in logs] == [0.0, 0.0]


def test_the_anchor_needs_a_start_and_a_weight(start: StructuredPolicy) -> None:
    assert Anchor.of(None, UpdateConfig(anchor_coef=1.0)) is None
    assert Anchor.of(start, UpdateConfig(anchor_coef=0.0)) is None
    anchor = Anchor.of(start, UpdateConfig(anchor_coef=2.0, anchor_decay=0.5))
    assert anchor is not None
    assert (anchor.weight(0), anchor.weight(3)) == (2.0, 0.25)  # 2 · 0.5³
    assert all(not p.requires_grad for p in anchor.reference.parameters())


def test_the_anchor_weight_decays_per_policy_step(env: OrdersEnv, start: StructuredPolicy) -> None:
    """One warm-up round, then one round of two policy steps: the last step's weight is 2 · 0.5¹ = 1,
    and the policy, once moved, sits at a positive KL from its start."""
    update = UpdateConfig(epochs=1, minibatches=2, critic_warmup=1, anchor_coef=2.0, anchor_decay=0.5)
    logs: list[IterationLog] = []
    train_ppo(env, PPOConfig(run=RUN, update=update), policy=start, on_log=logs.append)
    assert [log.anchor_coef for log in logs] == [0.0, 1.0]
    assert logs[0].anchor_kl == 0.0  # the warm-up leaves the actor where it started
    assert logs[1].anchor_kl > 0.0


def test_a_strong_anchor_keeps_the_policy_nearer_its_start(env: OrdersEnv, start: StructuredPolicy) -> None:
    """The same rounds at a high learning rate, without and with an anchor: KL(start ‖ trained) on the
    start policy's own states is smaller with it."""
    run = StructuredRunConfig(iterations=3, num_envs=2, rollout_steps=16, seed=3)
    drift = []
    for coef in (0.0, 5.0):
        update = UpdateConfig(epochs=2, minibatches=2, lr=1e-2, anchor_coef=coef, anchor_decay=1.0)
        trained = train_ppo(env, PPOConfig(run=run, update=update), policy=start)
        _, _, collector = build_run(env, run)
        batch = collector.collect(start)
        collector.close()
        obs, text, mask = (batch.flat(x) for x in (batch.obs, batch.text, batch.mask))
        with torch.no_grad():
            drift.append(start.act(obs, text, mask).kl(trained.policy.act(obs, text, mask)).mean().item())
    assert 0.0 < drift[1] < drift[0]


def _zero_means(start: StructuredPolicy) -> StructuredPolicy:
    """A copy of `start` whose number heads' means are 0 in every state."""
    policy = copy.deepcopy(start)
    with torch.no_grad():
        policy.mean_head.weight.zero_()
        policy.mean_head.bias.zero_()
    return policy


def _demos(policy: StructuredPolicy, skills: list[int], raw: torch.Tensor) -> Demonstrations:
    """Demonstrations of `skills` with number draws `raw` ``[S, H_num]`` (states and choices all 0)."""
    rows = len(skills)
    return Demonstrations(
        obs=torch.zeros((rows, policy.obs_dim)),
        text=torch.zeros((rows, policy.text_dim)),
        mask=torch.ones((rows, policy.layout.actions), dtype=torch.long),
        action=StructuredAction(
            torch.tensor(skills), raw, torch.zeros((rows, len(policy.layout.choices)), dtype=torch.long)
        ),
        solved=0,
        tasks=1,
    )


def test_refit_sets_each_number_heads_sigma_to_its_rms_error(start: StructuredPolicy) -> None:
    """Means forced to 0. The first number head's demonstrations ask for 0.3 and -0.4: σ = √((0.09 + 0.16)
    / 2) = √0.125, log σ = -1.039721. A row of another skill (its draw 9 is not the head's) does not
    count, and the other number heads, which no row uses, keep their log σ."""
    policy = _zero_means(start)
    owner = int(policy.layout.numeric[0][0])
    other = next(s for s in range(policy.layout.actions) if s not in {k for k, _ in policy.layout.numeric})
    raw = torch.zeros((3, len(policy.layout.numeric)))
    raw[:, 0] = torch.tensor([0.3, -0.4, 9.0])
    before = policy.log_std.detach().clone()
    log_std = refit_log_std(policy, _demos(policy, [owner, owner, other], raw))
    assert log_std[0].item() == pytest.approx(math.log(math.sqrt(0.125)), abs=1e-6)
    assert log_std[0].item() == pytest.approx(-1.039721, abs=1e-6)
    torch.testing.assert_close(log_std[1:], before[1:])
    torch.testing.assert_close(policy.log_std.detach(), log_std)


def test_refit_clamps_a_perfect_fit_to_the_smallest_sigma(start: StructuredPolicy) -> None:
    """Demonstrations the means hit exactly would give σ = 0; log σ stops at the range's floor."""
    policy = _zero_means(start)
    owner = int(policy.layout.numeric[0][0])
    demos = _demos(policy, [owner, owner], torch.zeros((2, len(policy.layout.numeric))))
    assert refit_log_std(policy, demos)[0].item() == LOG_STD_RANGE[0]


def test_aaac_from_an_anchored_start_pays_the_anchor_not_the_kl_to_the_previous_policy(
    env: OrdersEnv, start: StructuredPolicy
) -> None:
    """From a start policy the anchor takes the place of AAAC's KL penalty (β logged 0); without an anchor,
    or from scratch, the penalty stays."""
    anchored = AAACConfig(run=RUN, update=UpdateConfig(epochs=1, minibatches=2), beta0=2.0)
    loose = AAACConfig(run=RUN, update=UpdateConfig(epochs=1, minibatches=2, anchor_coef=0.0), beta0=2.0)
    assert not kl_penalised(anchored, start)
    assert kl_penalised(anchored, None)
    assert kl_penalised(loose, start)
    assert not kl_penalised(replace(loose, beta0=0.0), start)
    logs: dict[str, list[IterationLog]] = {"anchored": [], "loose": []}
    train_aaac(env, anchored, policy=start, on_log=logs["anchored"].append)
    train_aaac(env, loose, policy=start, on_log=logs["loose"].append)
    assert [log.kl_beta for log in logs["anchored"]] == [0.0, 0.0]
    assert all(log.anchor_coef > 0 for log in logs["anchored"])
    assert logs["loose"][-1].kl_beta == pytest.approx(2.0 * 0.999**3)
    assert all(log.anchor_coef == 0 for log in logs["loose"])
