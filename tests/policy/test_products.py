"""bfloat16 products for float32 models: the sampler's copies cover every linear layer but the output head;
training's cover only what does not train, so the trained weights keep float32 products and gradients."""

from __future__ import annotations

from contextlib import nullcontext
from typing import cast

import pytest
import torch

from sessionrl.policy.products import BF16Matmuls, FrozenBF16Matmuls
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_model, train_tokenizer

CONFIG = TinyModelConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)


@pytest.fixture
def model() -> torch.nn.Module:
    tokenizer = train_tokenizer(["a b c d e f g"] * 4, CONFIG)
    return build_tiny_model(CONFIG, tokenizer)


def body_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    head = model.get_output_embeddings()
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]


def test_bf16_products_change_only_the_bodys_linear_layers(model: torch.nn.Module) -> None:
    products = BF16Matmuls(model)
    head = cast(torch.nn.Linear, model.get_output_embeddings())
    linears = body_linears(model)
    assert set(products.copies) == {id(m.weight) for m in linears}
    body, x = linears[0], torch.randn(3, linears[0].in_features)
    outside = torch.nn.Linear(body.in_features, 5)
    with torch.no_grad(), products:
        rounded, kept, head_out = body(x), outside(x), head(torch.randn(2, head.in_features))
    assert rounded.dtype == torch.float32
    want = torch.nn.functional.linear(x.bfloat16(), body.weight.bfloat16()).float()
    torch.testing.assert_close(rounded, want, atol=0, rtol=0)
    assert not torch.equal(rounded, body(x))  # the products were rounded
    torch.testing.assert_close(kept, outside(x), atol=0, rtol=0)
    assert head_out.dtype == torch.float32


def test_frozen_products_round_what_does_not_train_and_leave_what_trains(model: torch.nn.Module) -> None:
    frozen, trained = body_linears(model)[:2]
    frozen.weight.requires_grad_(False)
    head = cast(torch.nn.Linear, model.get_output_embeddings()).requires_grad_(False)
    x, y, h = (torch.randn(4, m.in_features) for m in (frozen, trained, head))
    with FrozenBF16Matmuls(model):
        rounded, exact, logits = frozen(x), trained(y), head(h)
    want = torch.nn.functional.linear(x.bfloat16(), frozen.weight.bfloat16()).float()
    torch.testing.assert_close(rounded, want, atol=0, rtol=0)
    assert not torch.equal(rounded, frozen(x))
    torch.testing.assert_close(exact, trained(y), atol=0, rtol=0)
    torch.testing.assert_close(logits, head(h), atol=0, rtol=0)  # the head stays float32, frozen or not


def test_a_trained_weight_gets_its_gradient_through_a_frozen_bf16_layer(model: torch.nn.Module) -> None:
    """first -> second: the second layer is frozen and rounded, the first trains; its gradient arrives
    through the rounded product, close to float32's, and it changes when the frozen weight does (no copy
    is kept)."""
    first = torch.nn.Linear(8, 16)
    second = torch.nn.Linear(16, 4, bias=False).requires_grad_(False)
    x = torch.randn(5, 8)

    def grad(mode: bool) -> torch.Tensor:
        first.zero_grad()
        with FrozenBF16Matmuls(model) if mode else nullcontext():
            second(first(x)).square().sum().backward()
        assert first.weight.grad is not None
        return first.weight.grad.clone()

    exact, rounded = grad(False), grad(True)
    assert not torch.equal(exact, rounded)
    torch.testing.assert_close(rounded, exact, atol=0.05, rtol=0.02)
    with torch.no_grad():
        second.weight.mul_(2.0)
    torch.testing.assert_close(grad(True), 4 * rounded)  # (2W)ᵀ(2W·h): read anew, not from a copy
