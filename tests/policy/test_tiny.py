"""The tiny policy: tokenizer training, model size, save/load round-trips, determinism and chat formatting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from jinja2 import TemplateError
from transformers import PreTrainedTokenizerFast

from sessionrl.policy.tiny import (
    END_TOKEN,
    SPECIAL_TOKENS,
    TinyModelConfig,
    build_tiny_model,
    build_tiny_policy,
    default_placement,
    load_policy,
    train_tokenizer,
)

TOOLS = [
    {
        "name": "get_order_details",
        "description": "Look up an order by its id.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
    {
        "name": "cancel_pending_order",
        "description": "Cancel an order that has not shipped.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "reason": {"enum": ["no longer needed", "ordered by mistake"]},
            },
            "required": ["order_id", "reason"],
        },
    },
]
SYSTEM_PROMPT = "You are a retail support agent. Call one tool at a time as JSON and confirm before changes."


def corpus() -> list[str]:
    """Tool schemas, the system prompt and 40 expert-like sessions with JSON tool calls."""
    texts = [json.dumps(tool) for tool in TOOLS] + [SYSTEM_PROMPT]
    for i in range(40):
        call = {
            "name": "cancel_pending_order",
            "arguments": {"order_id": f"#W{1000 + i}", "reason": "no longer needed"},
        }
        texts.append(f"Please cancel order #W{1000 + i}, I no longer need it.")
        texts.append(json.dumps({"name": "get_order_details", "arguments": {"order_id": f"#W{1000 + i}"}}))
        texts.append(json.dumps(call))
        texts.append(f'{{"status": "cancelled", "order_id": "#W{1000 + i}", "refund": {10 + i}.5}}')
    return texts


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    build_tiny_policy(corpus(), TinyModelConfig(), out)
    return out


def test_default_model_has_between_one_and_five_million_parameters(built: Path) -> None:
    model, _ = load_policy(built, device=torch.device("cpu"), dtype=torch.float32)
    assert 1_000_000 <= model.num_parameters() <= 5_000_000
    # Tied embeddings: the output head is the input embedding, stored once.
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_checkpoint_is_safetensors(built: Path) -> None:
    assert (built / "model.safetensors").is_file()
    assert not list(built.glob("*.bin"))
    assert (built / "tokenizer.json").is_file()


def test_save_load_round_trip_gives_identical_logits(tmp_path: Path) -> None:
    model, tokenizer = build_tiny_policy(corpus(), TinyModelConfig(), tmp_path)
    loaded, loaded_tokenizer = load_policy(tmp_path, device=torch.device("cpu"), dtype=torch.float32)
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Cancel #W1003"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    assert loaded_tokenizer.encode(text, add_special_tokens=False) == ids[0].tolist()
    model.eval()
    with torch.no_grad():
        before = model(ids).logits
        after = loaded(ids).logits
    assert before.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.equal(before, after)


def test_tokenizer_round_trips_json_tool_calls_and_keeps_specials_whole(built: Path) -> None:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(built, local_files_only=True)
    text = (
        '<|assistant|>\n{"name": "cancel_pending_order", "arguments": {"order_id": "#W1007", '
        '"reason": "ordered by mistake", "note": "déjà vu ✓ 🙂", "qty": [1, 2.5e-3, null]}}<|end|>\n'
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    for token in SPECIAL_TOKENS:
        token_ids = tokenizer.encode(token, add_special_tokens=False)
        assert token_ids == [tokenizer.convert_tokens_to_ids(token)]
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|assistant|>")
    assert ids[-2] == tokenizer.eos_token_id
    assert tokenizer.eos_token == END_TOKEN
    assert len({tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}) == 3


def test_learned_merges_compress_domain_text(built: Path) -> None:
    # A trained vocabulary beats raw bytes on text like its training data: fewer tokens than UTF-8 bytes.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(built, local_files_only=True)
    text = json.dumps({"name": "get_order_details", "arguments": {"order_id": "#W1011"}})
    assert len(tokenizer.encode(text, add_special_tokens=False)) < len(text.encode()) / 2


def test_chat_template_format_and_unknown_role(built: Path) -> None:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(built, local_files_only=True)
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"},
        {"role": "tool", "content": "T"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = (
        "<|bos|><|system|>\nS<|end|>\n<|user|>\nU<|end|>\n<|assistant|>\nA<|end|>\n<|tool|>\nT<|end|>\n"
    )
    assert rendered == expected + "<|assistant|>\n"
    with pytest.raises(TemplateError, match="unknown chat role: critic"):
        tokenizer.apply_chat_template([{"role": "critic", "content": "x"}], tokenize=False)


def test_same_seed_same_weights_other_seed_other_weights() -> None:
    config = TinyModelConfig(hidden_size=64, intermediate_size=128, num_layers=2, vocab_size=400)
    first = train_tokenizer(corpus(), config)
    second = train_tokenizer(corpus(), config)
    assert first.get_vocab() == second.get_vocab()
    a = build_tiny_model(config, first).state_dict()
    b = build_tiny_model(config, second).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a)
    c = build_tiny_model(TinyModelConfig(hidden_size=64, intermediate_size=128, num_layers=2, seed=1), first)
    assert not torch.equal(a["model.embed_tokens.weight"], c.state_dict()["model.embed_tokens.weight"])


def test_building_leaves_the_global_rng_alone() -> None:
    config = TinyModelConfig(hidden_size=32, intermediate_size=64, num_layers=1, vocab_size=300)
    tokenizer = train_tokenizer(corpus(), config)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(config, tokenizer)
    assert torch.equal(torch.rand(3), expected)


def test_greedy_generation_extends_the_prompt_within_budget(built: Path) -> None:
    model, tokenizer = load_policy(built, device=torch.device("cpu"), dtype=torch.float32)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    batch = tokenizer([prompt], return_tensors="pt", add_special_tokens=False)
    out = model.generate(**batch, max_new_tokens=5, do_sample=False)
    assert out.shape[1] <= batch["input_ids"].shape[1] + 5
    assert out[0, : batch["input_ids"].shape[1]].tolist() == batch["input_ids"][0].tolist()


def test_load_policy_loads_in_the_requested_dtype_and_fills_a_missing_pad(
    built: Path, tmp_path: Path
) -> None:
    model, tokenizer = load_policy(built, device=torch.device("cpu"), dtype=torch.float32)
    tokenizer.pad_token = None
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    reloaded, reloaded_tokenizer = load_policy(tmp_path, device=torch.device("cpu"), dtype=torch.bfloat16)
    assert reloaded.dtype == torch.bfloat16
    assert not reloaded.training
    assert reloaded_tokenizer.pad_token == END_TOKEN


def test_load_policy_rejects_a_folder_without_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_policy(tmp_path / "nowhere")


def test_default_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_placement() == (torch.device("cpu"), torch.float32)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert default_placement() == (torch.device("cuda"), torch.bfloat16)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"vocab_size": 100}, "vocab_size must be at least"),
        ({"hidden_size": 130}, "multiple of num_heads"),
        ({"num_layers": 0}, "num_layers must be at least 1"),
        ({"max_positions": 8}, "max_positions must be at least 16"),
    ],
)
def test_config_rejects_bad_shapes(overrides: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TinyModelConfig(**overrides)
