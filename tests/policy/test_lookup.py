"""Draft tokens looked up in a row's own context: checked in one pass, they change nothing the engine
draws (greedily the same tokens and logprobs; sampled, the same distribution) while passes get fewer."""

from __future__ import annotations

import pytest
import torch
from engine_support import CONFIG, STOP, tiny_model

from sessionrl.policy.attention import FEW_QUERIES
from sessionrl.policy.kvstore import KVStore
from sessionrl.policy.llm import BatchingConfig, HFPolicy, SamplingConfig
from sessionrl.policy.lookup import Lookup, accepted
from sessionrl.policy.sampling import Sample, TorchEngine, draw, sample_batch
from sessionrl.policy.tiny import train_tokenizer


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_model()


def prompts() -> list[list[int]]:
    prefix = [(7 * i) % 250 + 10 for i in range(60)]
    return [[*prefix, 11, 12, 13], [*prefix, 40], [*prefix, 50, 51, 52, *prefix[:9]]]


def passes(model: torch.nn.Module) -> list[int]:
    """A counter of `model`'s forward passes."""
    count = [0]
    model.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    return count


def run(
    model: torch.nn.Module,
    rows: list[list[int]],
    draft: int,
    *,
    new: int = 24,
    store: KVStore | None = None,
    temperature: float = 0.0,
    stop: int = STOP,
) -> list[Sample]:
    return sample_batch(
        model,
        rows,
        pad_id=0,
        stop_ids=frozenset({stop}),
        config=SamplingConfig(max_new_tokens=new, temperature=temperature),
        generator=torch.Generator().manual_seed(5),
        prefix=store if store is not None else KVStore(),
        draft=draft,
    )


def test_a_draft_is_what_followed_the_latest_tokens_last_time() -> None:
    row = Lookup([1, 2, 3, 9, 1, 2, 3, 8, 1, 2], n=2)
    assert row.draft(3) == [3, 8, 1]  # the latest occurrence of (1, 2) before the end
    assert row.draft(0) == []
    row.append(7)
    assert row.draft(2) == []  # (2, 7) never appeared before


def test_greedy_drafts_give_the_same_replies_in_fewer_passes(model: torch.nn.Module) -> None:
    counted = passes(model)
    plain = run(model, prompts(), draft=0)
    one_a_pass = counted[0]
    counted[0] = 0
    drafted = run(model, prompts(), draft=4)
    assert [s.token_ids for s in drafted] == [s.token_ids for s in plain]
    for d, p in zip(drafted, plain, strict=True):
        torch.testing.assert_close(torch.tensor(d.logprobs), torch.tensor(p.logprobs), atol=1e-4, rtol=0)
    assert counted[0] < one_a_pass


def test_a_drafted_reply_keeps_its_budget_and_ends_at_a_stop_token(model: torch.nn.Module) -> None:
    plain = run(model, prompts(), draft=0, new=200)
    # a token the greedy replies write after their start, made a stop token: every reply ends at it
    stop = plain[0].token_ids[3]
    cut = run(model, prompts(), draft=0, new=200, stop=stop)
    drafted = run(model, prompts(), draft=4, new=200, stop=stop)
    assert [s.token_ids for s in drafted] == [s.token_ids for s in cut]
    assert all(s.token_ids.count(stop) <= 1 for s in drafted)
    for new in (1, 2, 7):
        assert all(len(s.token_ids) <= new for s in run(model, prompts(), draft=4, new=new))


def test_an_episodes_next_turn_reuses_a_drafted_turn_as_a_plain_one(model: torch.nn.Module) -> None:
    rows = prompts()
    plain_store, drafted_store = KVStore(), KVStore()
    first = run(model, rows, draft=0, store=plain_store)
    assert [s.token_ids for s in run(model, rows, draft=4, store=drafted_store)] == [
        s.token_ids for s in first
    ]
    # the rows kept after a drafted decode hold their tokens without the refused drafts' holes, and the
    # last drawn one too where a draft drew it (its keys and values were computed checking it)
    for kept in plain_store.entries:
        assert any(k[: len(kept)] == kept and len(k) - len(kept) in (0, 1) for k in drafted_store.entries)
    second = [[*p, *s.token_ids, 60, 61] for p, s in zip(rows, first, strict=True)]
    again = run(model, second, draft=4, store=drafted_store)
    whole = run(model, second, draft=0)
    assert [s.token_ids for s in again] == [s.token_ids for s in whole]


def test_sampled_drafts_keep_the_sampling_distribution() -> None:
    """A draft token kept with its probability, else the next token drawn without it: each token is
    distributed as one drawn alone, for a likely draft token and an unlikely one."""
    logits = torch.tensor([0.0, 1.5, 0.5, -1.0]).log_softmax(-1)
    want = logits.exp()
    config = SamplingConfig(temperature=1.0)
    trials = 40_000
    rows = logits.expand(trials, 4)
    for proposed in (1, 3):
        generator = torch.Generator().manual_seed(proposed)
        drafts = torch.full((trials, 1), proposed)
        kept, logp = accepted(rows[:, None], drafts, torch.ones(trials, dtype=torch.long), 1.0, generator)
        refused = torch.where(kept == 0, proposed, -1)
        redrawn, redrawn_logp = draw(rows, config, generator, refused)
        first = torch.where(kept == 1, proposed, redrawn)
        shares = torch.bincount(first, minlength=4) / trials
        torch.testing.assert_close(shares, want, atol=0.01, rtol=0)
        assert not bool((redrawn == proposed)[kept == 0].any())
        # the logprobs are the policy's, not the residual's
        torch.testing.assert_close(redrawn_logp, logits[redrawn])
        torch.testing.assert_close(logp[:, 0], logits[drafts[:, 0]])


def test_drafts_checked_against_a_bfloat16_cache_draw_what_single_steps_draw(model: torch.nn.Module) -> None:
    def engine(draft: int) -> TorchEngine:
        store = KVStore(dtype=torch.bfloat16)
        return TorchEngine(model, pad_id=0, stop_ids=frozenset({STOP}), store=store, bf16=False, draft=draft)

    rows, config = prompts(), SamplingConfig(max_new_tokens=24, temperature=0.0)
    single, drafted = engine(0), engine(4)
    counted = passes(model)
    want = single.sample(rows, config, torch.Generator())
    one_a_pass, counted[0] = counted[0], 0
    got = drafted.sample(rows, config, torch.Generator())
    assert drafted.narrow
    assert counted[0] < one_a_pass
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=2e-2, rtol=0)


def test_a_policy_drafts_as_its_batching_asks(model: torch.nn.Module) -> None:
    tokenizer = train_tokenizer(["a b c d e f g"] * 4, CONFIG)
    asked = HFPolicy(model, tokenizer, batching=BatchingConfig(draft_tokens=4))
    assert isinstance(asked.engine, TorchEngine)
    assert asked.engine.draft == 4
    assert isinstance(HFPolicy(model, tokenizer).engine, TorchEngine)
    for wrong in (-1, FEW_QUERIES):
        with pytest.raises(ValueError, match="draft_tokens"):
            BatchingConfig(draft_tokens=wrong)
