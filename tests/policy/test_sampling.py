"""The torch engine's kept caches: a shared prefix and each episode's earlier turns give the same tokens and
log-probabilities as sampling every prompt whole, prefill only what is new, stay within their bound, and
are dropped when the policy version changes."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from engine_support import CONFIG, STOP, tiny_model

from sessionrl.policy.engine import Completion
from sessionrl.policy.kvstore import KVStore, common_prefix
from sessionrl.policy.llm import SamplingConfig
from sessionrl.policy.sampling import Sample, TorchEngine, inverse_cdf, sample_batch
from sessionrl.policy.tiny import build_tiny_model, train_tokenizer


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_model()


def prompts() -> list[list[int]]:
    prefix = [(7 * i) % 250 + 10 for i in range(80)]
    return [[*prefix, 11, 12, 13], [*prefix, 40], [*prefix, 50, 51, 52, 53, 54, 55]]


def run(
    model: torch.nn.Module,
    rows: list[list[int]],
    store: KVStore | None,
    temperature: float = 0.0,
    new: int = 6,
) -> list[Sample]:
    config = SamplingConfig(max_new_tokens=new, temperature=temperature)
    return sample_batch(
        model,
        rows,
        pad_id=0,
        stop_ids=frozenset({STOP}),
        config=config,
        generator=torch.Generator().manual_seed(5),
        prefix=store,
    )


def assert_same(got: list[Sample], want: list[Sample]) -> None:
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-4, rtol=0)


def next_turns(rows: list[list[int]], replies: Sequence[Sample | Completion]) -> list[list[int]]:
    """Each conversation's next prompt: its prompt, its reply, then a tool result of a different length."""
    return [
        [*p, *s.token_ids, *range(60, 63 + i)] for i, (p, s) in enumerate(zip(rows, replies, strict=True))
    ]


def test_a_shared_prefix_gives_what_the_whole_prompts_give(model: torch.nn.Module) -> None:
    rows = prompts()
    assert common_prefix(rows) == 80
    store = KVStore(min_shared=32, turns=False)
    assert_same(run(model, rows, store), run(model, rows, None))
    assert (store.builds, [len(k) for k in store.entries]) == (1, [80])
    assert store.prefilled_tokens == 3 + 1 + 6 + 80  # the suffixes, and the prefix once
    # sampled at a temperature with the same generator, the draws agree too
    hot_plain, hot_shared = run(model, rows, None, 1.0), run(model, rows, KVStore(min_shared=32), 1.0)
    assert [s.token_ids for s in hot_shared] == [p.token_ids for p in hot_plain]


def test_an_episodes_next_turn_prefills_only_its_new_tokens(model: torch.nn.Module) -> None:
    rows = prompts()
    store = KVStore(min_shared=32)
    first = run(model, rows, store, new=5)
    # every row's prompt and reply but its last draw (never fed) is kept, besides the shared prefix
    kept = sorted(len(k) for k, e in store.entries.items() if not e.shared)
    assert kept == sorted(len(p) + len(s.token_ids) - 1 for p, s in zip(rows, first, strict=True))
    second = next_turns(rows, first)
    before = store.prefilled_tokens
    assert_same(run(model, second, store, 1.0), run(model, second, None, 1.0))
    new_tokens = sum(
        len(b) - len(a) - len(s.token_ids) + 1 for a, b, s in zip(rows, second, first, strict=True)
    )
    assert store.prefilled_tokens - before == new_tokens
    # the entries of the first turn gave way to those of the second
    assert sum(not e.shared for e in store.entries.values()) == len(rows)


def test_a_prompt_that_leaves_a_kept_turn_early_reuses_what_they_share(model: torch.nn.Module) -> None:
    rows = prompts()[:1]
    store = KVStore()
    (reply,) = run(model, rows, store, new=4)
    # re-rendered, the reply tokenizes differently from its third token on
    other = [[*rows[0], *reply.token_ids[:2], 99, 98, 97]]
    assert_same(run(model, other, store), run(model, other, None))
    assert store.reused_tokens == len(rows[0]) + 2


def test_the_store_keeps_within_its_bound_least_recently_used_first(model: torch.nn.Module) -> None:
    rows = prompts()
    store = KVStore(min_shared=32, max_tokens=200)
    run(model, rows, store, new=3)
    assert store.tokens <= 200
    assert store.evicted >= 1
    second = next_turns(rows, run(model, rows, None, new=3))
    assert_same(run(model, second, store), run(model, second, None))


def test_a_new_policy_version_drops_what_older_weights_computed(model: torch.nn.Module) -> None:
    engine = TorchEngine(
        model, pad_id=0, stop_ids=frozenset({STOP}), store=KVStore(min_shared=32), bf16=False
    )
    greedy = SamplingConfig(max_new_tokens=4, temperature=0.0)
    before = engine.sample(prompts(), greedy, torch.Generator())
    assert engine.store.entries
    assert {c.policy_version for c in before} == {0}
    changed = build_tiny_model(CONFIG, train_tokenizer(["a b c d e f g"] * 4, CONFIG))
    with torch.no_grad():
        for p, q in zip(changed.parameters(), model.parameters(), strict=True):
            p.copy_(q + 0.05 * torch.randn_like(q))
    engine.refresh(changed, 1)
    assert not engine.store.entries
    after = engine.sample(prompts(), greedy, torch.Generator())
    assert {c.policy_version for c in after} == {1}
    assert [c.token_ids for c in after] == [s.token_ids for s in run(changed, prompts(), None, new=4)]


def test_prompts_that_start_a_longer_one_take_it_from_that_one(model: torch.nn.Module) -> None:
    # the turns of one conversation asked at once (as the tool accuracy asks them), beside another one
    prefix, middle = prompts()[0][:80], [(3 * i) % 200 + 20 for i in range(40)]
    turn_1 = [*prefix, *middle, 12]
    turn_2 = [*turn_1, *middle[:36], 13, 14]
    rows = [turn_1, [*prefix, 50, 51], turn_2]
    store = KVStore(min_shared=32, turns=False)
    assert_same(run(model, rows, store), run(model, rows, None))
    # the whole batch's start, then the longest turn from it, then one new token for each turn
    assert store.builds == 2
    assert store.prefilled_tokens == 80 + (len(turn_2) - 1 - 80) + 1 + 2 + 1
    assert sorted(len(k) for k in store.entries) == [80, len(turn_2) - 1]


def test_a_prompt_with_many_new_tokens_is_prefilled_alone_and_not_kept(model: torch.nn.Module) -> None:
    prefix = prompts()[0][:80]
    rows = [[*prefix, 11, 12, 13], [*prefix, *range(100, 140)]]
    store = KVStore(min_shared=32, alone_cost=16, turns=False)
    assert_same(run(model, rows, store), run(model, rows, None))
    assert (store.builds, store.alone) == (1, 1)
    assert [len(k) for k in store.entries] == [80]
    assert store.prefilled_tokens == 80 + 39 + 3 + 1  # the prefix, the long row alone, then the batch


def test_prompts_alike_in_new_tokens_are_prefilled_together_however_many(model: torch.nn.Module) -> None:
    prefix = prompts()[0][:80]
    rows = [[*prefix, *range(100, 140)], [*prefix, *range(200, 238)]]
    store = KVStore(min_shared=32, alone_cost=16, turns=False)
    assert_same(run(model, rows, store), run(model, rows, None))
    assert store.alone == 0  # padded to 40 tokens, the shorter row wastes 2: less than a pass alone


def test_a_finished_row_too_long_for_the_store_is_not_kept(model: torch.nn.Module) -> None:
    store = KVStore(min_shared=32, max_tokens=60)
    run(model, prompts(), store, new=3)
    assert not store.entries
    assert store.evicted == 1 + len(prompts())  # the shared prefix, then every finished row


def test_short_or_single_prompts_run_whole(model: torch.nn.Module) -> None:
    store = KVStore(min_shared=32, turns=False)
    run(model, [prompts()[0]], store)
    run(model, [[5, 6, 7], [5, 6, 8]], store)
    assert store.builds == 0
    assert not store.entries


def forward_logprobs(model: torch.nn.Module, prompt: list[int], reply: tuple[int, ...]) -> torch.Tensor:
    """The trainer's view: one float32 forward pass over prompt and reply, the reply tokens' logprobs."""
    ids = torch.tensor([[*prompt, *reply]])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    rows = torch.arange(len(prompt) - 1, len(prompt) + len(reply) - 1)
    return logp[rows, torch.tensor(reply)]


@pytest.mark.parametrize(("bf16", "tolerance"), [(False, 1e-4), (True, 0.02)])
def test_a_samples_logprobs_are_the_trainers_forward_pass(
    model: torch.nn.Module, bf16: bool, tolerance: float
) -> None:
    engine = TorchEngine(model, pad_id=0, stop_ids=frozenset({STOP}), store=KVStore(min_shared=32), bf16=bf16)
    rows = prompts()
    worst = 0.0
    for temperature in (0.0, 1.0):
        sampling = SamplingConfig(max_new_tokens=8, temperature=temperature)
        completions = engine.sample(rows, sampling, torch.Generator().manual_seed(3))
        # a second turn reuses the kept caches, which must agree with the whole pass too
        completions += engine.sample(next_turns(rows, completions), sampling, torch.Generator())
        for c in completions:  # at temperature 1 the sampling distribution is the plain softmax
            want = forward_logprobs(model, list(c.prompt_token_ids), c.token_ids)
            got = torch.tensor(c.logprobs)
            torch.testing.assert_close(got, want, atol=tolerance, rtol=0)
            worst = max(worst, float((got - want).abs().max()))
    assert (worst > 1e-6) == bf16  # bfloat16 products round; float32 ones agree to float32's precision


def test_a_release_gives_back_the_caches_and_the_next_batch_computes_them_again(
    model: torch.nn.Module,
) -> None:
    engine = TorchEngine(model, pad_id=0, stop_ids=frozenset({STOP}), store=KVStore(min_shared=32), bf16=True)
    greedy = SamplingConfig(max_new_tokens=4, temperature=0.0)
    before = engine.sample(prompts(), greedy, torch.Generator())
    assert engine.store.entries
    engine.release()
    assert not engine.store.entries
    built = engine.store.builds
    after = engine.sample(prompts(), greedy, torch.Generator())
    assert engine.store.builds == built + 1  # the shared prefix computed again, not found kept
    assert [c.token_ids for c in after] == [c.token_ids for c in before]
    assert [c.policy_version for c in after] == [c.policy_version for c in before]
    for a, b in zip(after, before, strict=True):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


def test_a_refresh_takes_new_bf16_copies(model: torch.nn.Module) -> None:
    engine = TorchEngine(model, pad_id=0, stop_ids=frozenset({STOP}), bf16=True)
    greedy = SamplingConfig(max_new_tokens=4, temperature=0.0)
    engine.sample(prompts(), greedy, torch.Generator())
    changed = build_tiny_model(CONFIG, train_tokenizer(["a b c d e f g"] * 4, CONFIG))
    engine.refresh(changed, 1)
    after = engine.sample(prompts(), greedy, torch.Generator())
    for c in after:
        want = forward_logprobs(changed, list(c.prompt_token_ids), c.token_ids)
        torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=0.02, rtol=0)


def test_draws_follow_the_distribution_and_never_take_an_impossible_token() -> None:
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3]]).expand(100_000, 4).contiguous()
    drawn = inverse_cdf(probs, torch.Generator().manual_seed(2))
    shares = torch.bincount(drawn, minlength=4) / len(drawn)
    assert shares[1] == 0
    torch.testing.assert_close(shares, probs[0], atol=0.005, rtol=0)
