"""The onnxruntime-genai engine on a tiny model converted by its builder: the token ids it draws carry the
logprobs the float32 torch module gives them (greedy and at a temperature), an update reaches it as a
hot-loaded LoRA adapter that the next sample carries the version of, and what it cannot serve fails."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from sessionrl.orchestrator.policy import PolicyError
from sessionrl.policy.llm import LoRAConfig, SamplingConfig, with_lora
from sessionrl.policy.ortgenai import OrtGenAIEngine, pick_pad
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_model, train_tokenizer

pytestmark = pytest.mark.slow  # the builder converts the model in a subprocess (torch, transformers, onnx)

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("onnx")

CONFIG = TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128)
STOP = frozenset({1})
PAD = 0
PROMPTS = [[5, 6, 7, 8, 9], [5, 6, 7, 8, 10, 11, 12], [5, 6, 9]]
GREEDY = SamplingConfig(max_new_tokens=6, temperature=0.0)
HOT = SamplingConfig(max_new_tokens=6, temperature=0.7)


def randomise_lora(model: Any, seed: int) -> None:
    """Non-zero LoRA B matrices, so the adapters change what the model says."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.3)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, OrtGenAIEngine]:
    folder = tmp_path_factory.mktemp("ort")
    tokenizer = train_tokenizer(["a b c d e f g"] * 4, CONFIG)
    torch.manual_seed(0)
    base = build_tiny_model(CONFIG, tokenizer)
    base.save_pretrained(folder / "checkpoint")
    tokenizer.save_pretrained(folder / "checkpoint")
    model = with_lora(base, LoRAConfig(rank=4, alpha=8, top_blocks=1)).eval()
    randomise_lora(model, 1)
    engine = OrtGenAIEngine.for_checkpoint(
        folder / "checkpoint", model, folder / "cache", stop_ids=STOP, pad_id=PAD, version=0
    )
    return model, engine


def torch_logprobs(model: Any, prompt: list[int], ids: tuple[int, ...], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + list(ids)])).logits[0, len(prompt) - 1 : -1]
    logprobs = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logprobs[torch.arange(len(ids)), torch.tensor(ids)].tolist()


def check_against_torch(
    model: Any, engine: OrtGenAIEngine, sampling: SamplingConfig, seed: int = 3
) -> list[Any]:
    completions = engine.sample(PROMPTS, sampling, torch.Generator().manual_seed(seed))
    for prompt, completion in zip(PROMPTS, completions, strict=True):
        assert completion.prompt_token_ids == tuple(prompt)
        assert 1 <= len(completion.token_ids) <= sampling.max_new_tokens
        expected = torch_logprobs(model, prompt, completion.token_ids, sampling.temperature)
        assert completion.logprobs == pytest.approx(expected, abs=1e-4)
    return completions


def test_greedy_replies_carry_the_float32_modules_logprobs(served: tuple[Any, OrtGenAIEngine]) -> None:
    model, engine = served
    completions = check_against_torch(model, engine, GREEDY)
    for prompt, completion in zip(PROMPTS, completions, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + list(completion.token_ids)])).logits[
                0, len(prompt) - 1 : -1
            ]
        assert tuple(logits.argmax(-1).tolist()) == completion.token_ids  # greedy: the most likely token
        assert completion.policy_version == 0


def test_sampled_replies_carry_the_logprobs_of_the_tempered_distribution(
    served: tuple[Any, OrtGenAIEngine],
) -> None:
    model, engine = served
    first = check_against_torch(model, engine, HOT, seed=5)
    again = engine.sample(PROMPTS, HOT, torch.Generator().manual_seed(5))
    assert [c.token_ids for c in again] == [c.token_ids for c in first]  # the same seed, the same replies


def test_an_update_is_hot_loaded_and_the_next_sample_carries_its_version(
    served: tuple[Any, OrtGenAIEngine],
) -> None:
    model, engine = served
    before = engine.sample(PROMPTS, GREEDY, torch.Generator().manual_seed(3))
    randomise_lora(model, 2)
    engine.refresh(model, 1)
    assert engine.version == 1
    after = check_against_torch(model, engine, GREEDY)
    assert all(c.policy_version == 1 for c in after)
    assert [c.logprobs for c in after] != [c.logprobs for c in before]
    assert len(engine.refresh_seconds) == 2  # the first version's adapters, then this one's


def test_a_prompt_holding_the_pad_id_is_sampled_alone(served: tuple[Any, OrtGenAIEngine]) -> None:
    model, engine = served
    alone = engine.alone
    prompt = [5, PAD, 7, 8]
    [completion] = engine.sample([prompt], GREEDY, torch.Generator().manual_seed(3))
    assert engine.alone == alone + 1
    assert completion.logprobs == pytest.approx(
        torch_logprobs(model, prompt, completion.token_ids, 0.0), abs=1e-4
    )


def test_new_full_weights_without_lora_are_refused(
    served: tuple[Any, OrtGenAIEngine], tmp_path: Path
) -> None:
    model, engine = served
    plain = copy.deepcopy(model).merge_and_unload()
    engine.refresh(plain, engine.version + 1)
    with pytest.raises(PolicyError, match="without LoRA adapters"):
        engine.sample(PROMPTS, GREEDY, torch.Generator().manual_seed(3))
    engine.refresh(model, engine.version)  # leave the module's engine serving the adapters again


def test_the_pad_token_is_never_one_that_stops_replies() -> None:
    class Tokenizer:
        pad_token_id = 2  # SmolLM2 pads with <|im_end|>, which ends every message

        def __len__(self) -> int:
            return 100

    assert pick_pad(Tokenizer(), frozenset({2})) == 0
    assert pick_pad(Tokenizer(), frozenset({0, 2})) == 99
    assert pick_pad(Tokenizer(), frozenset({1})) == 2


def test_the_config_asks_for_lora_with_the_ortgenai_engine() -> None:
    from sessionrl.train.config import ModelSection

    assert ModelSection(engine="ortgenai", lora=LoRAConfig()).engine == "ortgenai"
    with pytest.raises(ValueError, match=r"ortgenai needs model\.lora"):
        ModelSection(engine="ortgenai")
