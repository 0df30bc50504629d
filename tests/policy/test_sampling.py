"""Shared-prefix sampling: the same tokens and log-probabilities as sampling each prompt whole, with the
prefix computed once and kept until the weights change."""

from __future__ import annotations

import pytest
import torch

from sessionrl.policy.llm import SamplingConfig
from sessionrl.policy.sampling import PrefixCache, common_prefix, sample_batch
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_model, train_tokenizer

CONFIG = TinyModelConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    tokenizer = train_tokenizer(["a b c d e f g"] * 4, CONFIG)
    built = build_tiny_model(CONFIG, tokenizer)
    built.eval()
    return built


def prompts() -> list[list[int]]:
    prefix = [(7 * i) % 250 + 10 for i in range(80)]
    return [[*prefix, 11, 12, 13], [*prefix, 40], [*prefix, 50, 51, 52, 53, 54, 55]]


def run(model: torch.nn.Module, rows: list[list[int]], prefix: PrefixCache | None, temperature: float = 0.0):  # type: ignore[no-untyped-def]
    config = SamplingConfig(max_new_tokens=6, temperature=temperature)
    return sample_batch(
        model,
        rows,
        pad_id=0,
        stop_ids=frozenset({1}),
        config=config,
        generator=torch.Generator().manual_seed(5),
        prefix=prefix,
    )


def test_a_shared_prefix_gives_what_the_whole_prompts_give(model: torch.nn.Module) -> None:
    rows = prompts()
    assert common_prefix(rows) == 80
    plain = run(model, rows, None)
    cache = PrefixCache(min_tokens=32)
    shared = run(model, rows, cache)
    assert (cache.builds, len(cache.ids)) == (1, 80)
    assert [s.token_ids for s in shared] == [p.token_ids for p in plain]
    for s, p in zip(shared, plain, strict=True):
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(p.logprobs), atol=1e-4, rtol=0)
    # sampled at a temperature with the same generator, the draws agree too
    hot_plain, hot_shared = run(model, rows, None, 1.0), run(model, rows, PrefixCache(min_tokens=32), 1.0)
    assert [s.token_ids for s in hot_shared] == [p.token_ids for p in hot_plain]


def test_the_kept_prefix_serves_later_batches_until_the_weights_change(model: torch.nn.Module) -> None:
    rows = prompts()
    cache = PrefixCache(min_tokens=32)
    run(model, rows[:2], cache)
    (alone,) = run(model, [rows[2]], cache)
    assert (cache.builds, cache.hits) == (1, 1)
    assert alone.token_ids == run(model, [rows[2]], None)[0].token_ids
    with torch.no_grad():
        next(model.parameters()).mul_(1.0)  # an in-place update, as an optimiser step makes
    run(model, rows, cache)
    assert cache.builds == 2
    other = [[3, 4, 5, *r[3:]] for r in rows]  # another prefix: computed fresh, and kept instead
    run(model, other, cache)
    assert (cache.builds, cache.ids[:3]) == (3, (3, 4, 5))


def test_short_or_single_prompts_run_whole(model: torch.nn.Module) -> None:
    cache = PrefixCache(min_tokens=32)
    run(model, [prompts()[0]], cache)
    run(model, [[5, 6, 7], [5, 6, 8]], cache)
    assert cache.builds == 0
