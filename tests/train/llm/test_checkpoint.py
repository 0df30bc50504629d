"""Checkpoint weights in the layout transformers and peft load, read back exactly by `load_checkpoint`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import save_model
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from sessionrl.policy.llm import LoRAConfig, with_lora
from sessionrl.train.llm.checkpoint import LoopState, load_checkpoint, save_checkpoint

IDS = torch.tensor([[3, 7, 1, 9, 4]])


def tiny(seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=30,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=16,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def with_adapters(model: LlamaForCausalLM, seed: int) -> PeftModel:
    lora: PeftModel = with_lora(model, LoRAConfig(rank=2, top_blocks=1, targets=("q_proj", "v_proj")))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_" in name:
                p.normal_()  # as if trained: B is no longer 0
    return lora


def same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_model_checkpoint_loads_with_from_pretrained_and_back_into_the_run(tmp_path: Path) -> None:
    model = tiny(0)
    save_checkpoint(tmp_path / "ckpt", model, None, LoopState(step=3))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "model")
    with torch.no_grad():
        assert torch.equal(loaded(IDS).logits, model(IDS).logits)

    other = tiny(1)
    assert not same_state(other, model)
    assert load_checkpoint(tmp_path / "ckpt", other, None) == LoopState(step=3)
    assert same_state(other, model)
    assert other.lm_head.weight is other.model.embed_tokens.weight  # still tied


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")  # peft, as in with_lora
def test_a_lora_checkpoint_loads_with_peft_on_its_base_and_back_into_the_run(tmp_path: Path) -> None:
    model = with_adapters(tiny(0), seed=5)
    save_checkpoint(tmp_path / "ckpt", model, None, LoopState(step=1))
    assert (tmp_path / "ckpt" / "model" / "adapter_config.json").is_file()
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "base")
    loaded = PeftModel.from_pretrained(base, tmp_path / "ckpt" / "model")
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, model(IDS).logits)

    other = with_adapters(tiny(1), seed=6)  # another base under other adapters
    load_checkpoint(tmp_path / "ckpt", other, None)
    assert same_state(other, model)


def test_a_checkpoint_of_the_older_single_file_layout_still_loads(tmp_path: Path) -> None:
    model = tiny(0)
    save_checkpoint(tmp_path / "ckpt", model, None, LoopState())
    for path in (tmp_path / "ckpt" / "model").iterdir():
        path.unlink()
    (tmp_path / "ckpt" / "model").rmdir()
    save_model(model, str(tmp_path / "ckpt" / "model.safetensors"))
    other = tiny(1)
    load_checkpoint(tmp_path / "ckpt", other, None)
    assert same_state(other, model)


def test_a_checkpoint_missing_weights_is_refused(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "ckpt", tiny(0), None, LoopState())
    bigger = LlamaForCausalLM(LlamaConfig(**(tiny(0).config.to_dict() | {"num_hidden_layers": 3})))
    with pytest.raises(RuntimeError, match="lacks weights"):
        load_checkpoint(tmp_path / "ckpt", bigger, None)
