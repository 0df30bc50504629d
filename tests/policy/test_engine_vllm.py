"""The vLLM engine against a simulated vLLM server (`tests/policy/vllm_sim.py`) over real HTTP: what it
stores is what the server sent, transient failures are retried and the rest fail loudly, and a new
policy version reaches the server as a LoRA adapter that the next sample names and carries."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from vllm_sim import VLLMSimulator

from sessionrl.orchestrator.policy import PolicyError
from sessionrl.policy.llm import HFPolicy, LoRAConfig, SamplingConfig, with_lora
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_model, train_tokenizer
from sessionrl.policy.vllm import VLLMEngine, VLLMSettings

CONFIG = TinyModelConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
STOP = frozenset({1})
PROMPTS = [[5, 6, 7, 8, 9], [5, 6, 7, 8, 10, 11], [5, 6, 7, 8, 9]]
HOT = SamplingConfig(max_new_tokens=6, temperature=0.7)


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return train_tokenizer(["a b c d e f g"] * 4, CONFIG)


@pytest.fixture(scope="module")
def base(tokenizer) -> torch.nn.Module:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    built = build_tiny_model(CONFIG, tokenizer)
    built.eval()
    return built


@pytest.fixture
def server(base: torch.nn.Module) -> Iterator[VLLMSimulator]:
    with VLLMSimulator(base, served="tiny-base") as sim:
        yield sim


def engine_for(sim: VLLMSimulator, tmp_path: Path, **settings: object) -> VLLMEngine:
    chosen = {"backoff_s": 0.0, **settings}
    return VLLMEngine(
        VLLMSettings(url=sim.url, model=sim.served, adapters=tmp_path / "adapters", **chosen),  # type: ignore[arg-type]
        stop_ids=STOP,
    )


def teacher_forced(
    model: torch.nn.Module, prompt: list[int], ids: tuple[int, ...], temperature: float
) -> list[float]:
    """Log-probability of each of `ids` after `prompt` under softmax(logits / temperature)."""
    with torch.no_grad():
        logits = model(torch.tensor([[*prompt, *ids]])).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1).tolist()


@pytest.mark.parametrize("legacy", [False, True])
def test_completions_carry_the_servers_ids_and_logprobs(
    server: VLLMSimulator, base: torch.nn.Module, tmp_path: Path, legacy: bool
) -> None:
    server.legacy = legacy  # without token_ids the ids come from the token_id:<id> strings
    engine = engine_for(server, tmp_path)
    done = engine.sample(PROMPTS, HOT, torch.Generator().manual_seed(1))
    sent = {(*a.request["prompt"], a.request["seed"]) for a in server.answered}
    assert len(sent) == 3  # one request per prompt, each with its own seed (identical prompts differ)
    for prompt, completion in zip(PROMPTS, done, strict=True):
        assert completion.prompt_token_ids == tuple(prompt)
        assert completion.policy_version == 0
        (answer,) = [a for a in server.answered if a.token_ids == list(completion.token_ids)]
        assert list(completion.logprobs) == answer.logprobs
        assert (answer.request["temperature"], answer.request["stop_token_ids"]) == (0.7, [1])
        assert completion.logprobs == pytest.approx(
            teacher_forced(base, prompt, completion.token_ids, 0.7), abs=1e-4
        )


def test_transient_failures_are_retried_and_others_fail_loudly(server: VLLMSimulator, tmp_path: Path) -> None:
    server.failures, server.latency_s = 2, 0.01
    engine = engine_for(server, tmp_path, concurrency=1)
    assert len(engine.sample(PROMPTS[:1], HOT, torch.Generator())) == 1
    assert engine.retried == 2
    server.failures = 10
    with pytest.raises(PolicyError, match="failed 2 times; last: HTTP 503"):
        engine_for(server, tmp_path, retries=1).sample(PROMPTS[:1], HOT, torch.Generator())
    server.failures, server.failure_status = 1, 400
    with pytest.raises(PolicyError, match="refused the request: HTTP 400"):
        engine_for(server, tmp_path).sample(PROMPTS[:1], HOT, torch.Generator())
    with pytest.raises(PolicyError, match="ConnectError"):
        VLLMEngine(VLLMSettings(url="http://127.0.0.1:9", model="x", retries=0), stop_ids=STOP).sample(
            PROMPTS[:1], HOT, torch.Generator()
        )


def test_an_update_reaches_the_server_as_a_lora_adapter_and_the_next_sample_carries_its_version(
    server: VLLMSimulator,
    base: torch.nn.Module,
    tokenizer,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    model = with_lora(copy.deepcopy(base), LoRAConfig(rank=2, alpha=4, top_blocks=1))
    policy = HFPolicy(model, tokenizer, SamplingConfig(max_new_tokens=6, temperature=0.0))
    policy.use(engine_for(server, tmp_path))
    (before,) = policy.sample_prompts(PROMPTS[:1])
    assert before.policy_version == 0
    assert [load["lora_name"] for load in server.loads] == ["policy-v0"]
    # an update: the adapters move, the trainer raises the version
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5 * torch.randn_like(p))
    policy.version += 1
    (after,) = policy.sample_prompts(PROMPTS[:1])
    assert after.policy_version == 1
    assert [load["lora_name"] for load in server.loads] == ["policy-v0", "policy-v1"]
    assert server.answered[-1].request["model"] == "policy-v1"
    assert set(server.adapters) == {"policy-v1"}  # the older adapter was unloaded
    assert after.logprobs == pytest.approx(teacher_forced(model, PROMPTS[0], after.token_ids, 1.0), abs=1e-4)
    # the same version refreshed again (a module swapped in): its adapter is replaced, not refused
    policy.version = 1
    policy.sample_prompts(PROMPTS[:1])
    assert [load["lora_name"] for load in server.loads] == ["policy-v0", "policy-v1", "policy-v1"]


def test_a_model_without_adapters_cannot_take_a_new_version(
    server: VLLMSimulator, base: torch.nn.Module, tmp_path: Path
) -> None:
    engine = engine_for(server, tmp_path)
    engine.refresh(base, 0)  # the server's own weights: served as they are
    assert engine.sample(PROMPTS[:1], HOT, torch.Generator())[0].policy_version == 0
    engine.refresh(base, 1)
    with pytest.raises(PolicyError, match="without LoRA adapters"):
        engine.sample(PROMPTS[:1], HOT, torch.Generator())
