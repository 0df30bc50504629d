"""The examples study applies each variant's changes where they belong: the update, or the trainer."""

from __future__ import annotations

from research.structured_examples import VARIANTS, changed
from sessionrl.train.structured.aaac import AAACConfig
from sessionrl.train.structured.ppo import PPOConfig, UpdateConfig


def test_update_fields_go_to_the_update_and_the_rest_to_the_trainer() -> None:
    start = AAACConfig(update=UpdateConfig(lr=1e-3), beta0=0.1)
    out = changed(start, {"lr": 3e-4, "critic_warmup": 5, "beta0": 0.5})
    assert isinstance(out, AAACConfig)
    assert (out.update.lr, out.update.critic_warmup, out.beta0) == (3e-4, 5, 0.5)
    assert out.update.anchor_coef == start.update.anchor_coef


def test_every_variant_applies_to_ppo() -> None:
    for name, changes in VARIANTS.items():
        out = changed(PPOConfig(), changes)
        for key, value in changes.items():
            assert getattr(out.update, key) == value, name
