"""The tiny model the torch engine's tests sample from."""

from __future__ import annotations

import torch

from sessionrl.policy.tiny import TinyModelConfig, build_tiny_model, train_tokenizer

CONFIG = TinyModelConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
STOP = 1


def tiny_model() -> torch.nn.Module:
    """A freshly built tiny model in eval mode (the same weights each call)."""
    built = build_tiny_model(CONFIG, train_tokenizer(["a b c d e f g"] * 4, CONFIG))
    built.eval()
    return built
