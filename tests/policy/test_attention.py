"""`gqa_sdpa` gives transformers' SDPA attention's outputs and gradients on padded batches, hands SDPA the
grouped key/value heads without repeating them, and the engine's samples over it keep the trainer's
logprobs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from transformers import LlamaConfig, LlamaForCausalLM

from sessionrl.policy.attention import GQA_SDPA
from sessionrl.policy.llm import SamplingConfig
from sessionrl.policy.sampling import KVStore, TorchEngine, left_pad

HEADS, KV_HEADS = 6, 2


def grouped_model(attention: str) -> LlamaForCausalLM:
    """A small Llama whose 6 query heads share 2 key/value heads, the same weights whatever `attention`."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=120,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
    )
    model = LlamaForCausalLM(config)
    model.set_attn_implementation(attention)
    model.train(False)
    return model


class SDPACalls(TorchFunctionMode):
    """Records the key/value head count and `enable_gqa` of every `scaled_dot_product_attention` call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, int, bool]] = []

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls.append((args[0].shape[2], args[1].shape[1], bool(kwargs.get("enable_gqa", False))))
        return func(*args, **kwargs)


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    rows = [[(5 * i + j) % 100 + 3 for i in range(12 + 7 * j)] for j in range(3)]
    return left_pad(rows, pad_id=0)


def test_a_padded_batch_gives_sdpas_logits_and_gradients() -> None:
    ids, mask = padded_batch()
    grouped, plain = grouped_model(GQA_SDPA), grouped_model("sdpa")
    got, want = (m(input_ids=ids, attention_mask=mask).logits for m in (grouped, plain))
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    got[real].square().mean().backward()
    want[real].square().mean().backward()
    for (name, a), b in zip(grouped.named_parameters(), plain.parameters(), strict=True):
        assert a.grad is not None, name
        assert b.grad is not None, name
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_a_padded_prefill_reads_the_grouped_heads_unrepeated() -> None:
    ids, mask = padded_batch()
    for attention, want in ((GQA_SDPA, (KV_HEADS, True)), ("sdpa", (HEADS, False))):
        calls = SDPACalls()
        with torch.no_grad(), calls:
            grouped_model(attention)(input_ids=ids, attention_mask=mask)
        assert {c[1:] for c in calls.calls} == {want}, attention


@pytest.mark.parametrize("bf16", [False, True])
def test_samples_over_grouped_heads_keep_the_trainers_logprobs(bf16: bool) -> None:
    model, reference = grouped_model(GQA_SDPA), grouped_model("sdpa")
    engine = TorchEngine(model, pad_id=0, stop_ids=frozenset({1}), store=KVStore(min_shared=8), bf16=bf16)
    prefix = [(3 * i) % 100 + 5 for i in range(20)]
    rows = [[*prefix, 7, 8], [*prefix, 9], [*prefix, 10, 11, 12, 13]]
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    first = engine.sample(rows, sampling, torch.Generator().manual_seed(1))
    following = [[*c.prompt_token_ids, *c.token_ids, 20 + i] for i, c in enumerate(first)]
    completions = first + engine.sample(following, sampling, torch.Generator().manual_seed(2))
    for c in completions:
        whole = torch.tensor([[*c.prompt_token_ids, *c.token_ids]])
        with torch.no_grad():
            logp = torch.log_softmax(reference(input_ids=whole).logits[0], dim=-1)
        at = torch.arange(len(c.prompt_token_ids) - 1, whole.shape[1] - 1)
        want = logp[at, torch.tensor(c.token_ids)]
        torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=0.02 if bf16 else 1e-4, rtol=0)
