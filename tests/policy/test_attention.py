"""The attention over a narrow (bfloat16) key/value cache: a decode step reads only the filled positions
the mask allows, agrees with SDPA on the same rounded keys, and the torch engine sampling from such a
cache writes what its float32 cache writes, turn after turn, in half the memory."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from sessionrl.policy.attention import FEW_QUERIES, decode_attention, kept_mask, kept_or_sdpa
from sessionrl.policy.kvstore import KVStore
from sessionrl.policy.llm import BatchingConfig, HFPolicy, SamplingConfig
from sessionrl.policy.sampling import TorchEngine
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_model, train_tokenizer
from sessionrl.train.llm.packing import use_packed_attention

ROWS, HEADS, KV_HEADS, DIM, FILLED, CAPACITY = 3, 6, 2, 16, 40, 56


class Heads(torch.nn.Module):
    """What transformers' SDPA function reads from an attention module: its grouping."""

    num_key_value_groups = HEADS // KV_HEADS
    is_causal = True


def cache() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A query, a bfloat16 cache whose buffers hold `FILLED` positions and zeroed room up to `CAPACITY`,
    and a mask leaving out the first 5 positions of row 1 (padding)."""
    g = torch.Generator().manual_seed(0)
    query = torch.randn(ROWS, HEADS, 1, DIM, generator=g)
    keys = torch.zeros(ROWS, KV_HEADS, CAPACITY, DIM, dtype=torch.bfloat16)
    values = torch.zeros_like(keys)
    keys[:, :, :FILLED] = torch.randn(ROWS, KV_HEADS, FILLED, DIM, generator=g)
    values[:, :, :FILLED] = torch.randn(ROWS, KV_HEADS, FILLED, DIM, generator=g)
    mask = torch.ones(ROWS, 1, 1, FILLED, dtype=torch.bool)
    mask[1, ..., :5] = False
    return query, keys, values, mask


def test_a_decode_step_reads_the_filled_positions_the_mask_allows() -> None:
    query, keys, values, mask = cache()
    got = decode_attention(query, keys, values, mask, scaling=DIM**-0.5)
    k = keys[:, :, :FILLED].float().repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = values[:, :, :FILLED].float().repeat_interleave(HEADS // KV_HEADS, dim=1)
    want = F.scaled_dot_product_attention(query, k, v, attn_mask=mask).transpose(1, 2)
    assert got.shape == (ROWS, 1, HEADS, DIM)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=3e-2, rtol=0)
    # the room past the filled part holds zeros, which would draw weight if it were read
    everything = torch.ones(ROWS, 1, 1, CAPACITY, dtype=torch.bool)
    assert not torch.allclose(decode_attention(query, keys, values, everything), want, atol=3e-2)


def test_draft_tokens_checked_with_the_decoded_one_read_their_own_mask_rows() -> None:
    _, keys, values, _ = cache()
    query = torch.randn(ROWS, HEADS, 3, DIM, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(ROWS, 1, 3, FILLED, dtype=torch.bool).tril(diagonal=FILLED - 3)
    mask[1, ..., :5] = False  # padding
    mask[0, ..., FILLED - 2] = False  # a refused draft token's hole
    got = decode_attention(query, keys, values, mask, scaling=DIM**-0.5)
    k = keys[:, :, :FILLED].float().repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = values[:, :, :FILLED].float().repeat_interleave(HEADS // KV_HEADS, dim=1)
    want = F.scaled_dot_product_attention(query, k, v, attn_mask=mask).transpose(1, 2)
    assert got.shape == (ROWS, 3, HEADS, DIM)
    torch.testing.assert_close(got, want, atol=3e-2, rtol=0)


def test_an_additive_mask_reads_as_the_boolean_one() -> None:
    query, keys, values, mask = cache()
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    torch.testing.assert_close(
        decode_attention(query, keys, values, additive), decode_attention(query, keys, values, mask)
    )


def test_keys_in_the_querys_dtype_go_to_sdpa_unchanged() -> None:
    g = torch.Generator().manual_seed(1)
    query = torch.randn(ROWS, HEADS, 7, DIM, generator=g)
    keys, values = (torch.randn(ROWS, KV_HEADS, 7, DIM, generator=g) for _ in range(2))
    got, _ = kept_or_sdpa(Heads(), query, keys, values, None)
    k, v = (t.repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (keys, values))
    want = F.scaled_dot_product_attention(query, k, v, is_causal=True).transpose(1, 2)
    torch.testing.assert_close(got, want)


def test_a_prefill_against_a_narrow_cache_attends_as_sdpa_over_its_widened_repeated_keys() -> None:
    g = torch.Generator().manual_seed(4)
    queries = FEW_QUERIES + 4
    query = torch.randn(ROWS, HEADS, queries, DIM, generator=g)
    keys, values = (torch.randn(ROWS, KV_HEADS, FILLED, DIM, generator=g).bfloat16() for _ in range(2))
    mask = torch.ones(ROWS, 1, queries, FILLED, dtype=torch.bool).tril(diagonal=FILLED - queries)
    mask[1, ..., :5] = False  # padding
    got, _ = kept_or_sdpa(Heads(), query, keys, values, mask)
    want, _ = sdpa_attention_forward(Heads(), query, keys.float(), values.float(), mask)
    assert got.shape == (ROWS, queries, HEADS, DIM)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # no cache yet and no padding: no mask, every query sees the positions up to its own
    first, second = keys[:, :, :queries], values[:, :, :queries]
    got, _ = kept_or_sdpa(Heads(), query, first, second, None)
    want, _ = sdpa_attention_forward(Heads(), query, first.float(), second.float(), None)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_a_prefill_without_a_mask_over_more_positions_than_queries_or_with_dropout_is_refused() -> None:
    query = torch.randn(ROWS, HEADS, FEW_QUERIES + 1, DIM)
    keys = torch.randn(ROWS, KV_HEADS, FILLED, DIM).bfloat16()
    with pytest.raises(ValueError, match="without a mask"):
        kept_or_sdpa(Heads(), query, keys, keys, None)
    # a narrow cache serves sampling, where nothing drops out
    with pytest.raises(ValueError, match="dropout"):
        kept_or_sdpa(Heads(), query, keys, keys, None, dropout=0.1)


def test_a_narrow_decode_step_without_its_mask_is_refused() -> None:
    query, keys, values, _ = cache()
    with pytest.raises(ValueError, match="needs a mask"):
        kept_or_sdpa(Heads(), query, keys, values, None)


def test_the_mask_function_always_builds_a_decode_steps_mask() -> None:
    no_padding = torch.ones(2, 9, dtype=torch.bool)
    decode = kept_mask(batch_size=2, q_length=1, kv_length=9, q_offset=8, attention_mask=no_padding)
    assert decode is not None
    assert decode.shape == (2, 1, 1, 9)
    assert bool(decode.all())
    checked = kept_mask(batch_size=2, q_length=3, kv_length=9, q_offset=6, attention_mask=no_padding)
    assert checked is not None  # a drawn token and two draft tokens: causal among themselves
    assert checked[0, 0].long().sum(-1).tolist() == [7, 8, 9]
    wide = FEW_QUERIES + 1
    no_padding = torch.ones(2, wide, dtype=torch.bool)
    prefill = kept_mask(batch_size=2, q_length=wide, kv_length=wide, attention_mask=no_padding)
    assert prefill is None  # plainly causal: SDPA's is_causal, as the "sdpa" attention does


CONFIG = TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=96)


def two_turns(engine: TorchEngine) -> list[list[tuple[tuple[int, ...], tuple[float, ...]]]]:
    prefix = [(7 * i) % 250 + 10 for i in range(70)]
    rows = [[*prefix, 11, 12], [*prefix, 40], [*prefix, 50, 51, 52, 53]]
    config = SamplingConfig(max_new_tokens=8, temperature=0.0)
    turns = []
    for _ in range(2):
        out = engine.sample(rows, config, torch.Generator().manual_seed(3))
        turns.append([(c.token_ids, c.logprobs) for c in out])
        rows = [[*r, *c.token_ids, 60, 61 + i] for i, (r, c) in enumerate(zip(rows, out, strict=True))]
    return turns


@pytest.fixture
def model() -> torch.nn.Module:
    tokenizer = train_tokenizer(["a b c d e f g"] * 4, CONFIG)
    built = build_tiny_model(CONFIG, tokenizer)
    built.eval()
    return built


def test_the_engine_samples_from_a_bfloat16_cache_as_from_a_float32_one(model: torch.nn.Module) -> None:
    wide = TorchEngine(model, pad_id=0, stop_ids=frozenset({1}), store=KVStore(min_shared=32), bf16=False)
    want = two_turns(wide)
    narrow_store = KVStore(min_shared=32, dtype=torch.bfloat16)
    narrow = TorchEngine(model, pad_id=0, stop_ids=frozenset({1}), store=narrow_store, bf16=False)
    use_packed_attention(model)  # as a training step leaves the shared module: the engine switches back
    got = two_turns(narrow)
    assert narrow.narrow
    assert not wide.narrow
    assert narrow_store.hits > 0  # the second turn read the first's bfloat16 caches
    assert all(kv[0][0].dtype == torch.bfloat16 for kv in (e.kv for e in narrow_store.entries.values()))
    for turn_got, turn_want in zip(got, want, strict=True):
        for (ids_got, lp_got), (ids_want, lp_want) in zip(turn_got, turn_want, strict=True):
            assert ids_got == ids_want
            torch.testing.assert_close(torch.tensor(lp_got), torch.tensor(lp_want), atol=5e-2, rtol=0)


def test_a_policy_keeps_bfloat16_caches_when_its_batching_asks(model: torch.nn.Module) -> None:
    tokenizer = train_tokenizer(["a b c d e f g"] * 4, CONFIG)
    asked = HFPolicy(model, tokenizer, batching=BatchingConfig(kv_cache="bfloat16"))
    plain = HFPolicy(model, tokenizer)
    assert isinstance(asked.engine, TorchEngine)
    assert isinstance(plain.engine, TorchEngine)
    assert asked.engine.store.dtype == torch.bfloat16
    assert asked.engine.narrow
    assert not plain.engine.narrow
    with pytest.raises(ValueError, match="kv_cache"):
        BatchingConfig(kv_cache="int8")
