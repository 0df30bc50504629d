"""The Hugging Face policy backend: action format, prompts, cached batched sampling, batching, LoRA."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from sessionrl.orchestrator.policy import PolicyError, PolicyReply, parse_tool_call
from sessionrl.policy.llm import (
    Batcher,
    HFPolicy,
    LoRAConfig,
    SamplingConfig,
    final_action,
    parse_final,
    system_prompt,
    tool_action,
    tool_message,
    with_lora,
)
from sessionrl.policy.sampling import TorchEngine, left_pad, sample_batch
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.session.model import Message
from sessionrl.skills import SkillContract

CONTRACT = SkillContract.model_validate(
    {
        "name": "inventory_check",
        "description": "Stock of one SKU.",
        "input_schema": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]},
    }
)
CONFIG = TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
CHAT = (
    Message(role="system", content="You check stock."),
    Message(role="user", content="Is SKU-12 in stock?"),
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    texts = [system_prompt("You check stock.", [CONTRACT])]
    texts += [tool_action("inventory_check", {"sku": f"SKU-{i}"}) for i in range(60)]
    texts += [final_action(f"SKU-{i} has {i} units.") for i in range(60)]
    folder = tmp_path_factory.mktemp("tiny-llm")
    build_tiny_policy(texts, CONFIG, folder)
    return folder


def load(model_dir: Path, **sampling: float) -> HFPolicy:
    return HFPolicy.load(
        model_dir,
        SamplingConfig(**sampling),
        device=torch.device("cpu"),
        dtype=torch.float32,  # type: ignore[arg-type]
    )


def test_actions_round_trip_through_both_parsers() -> None:
    text = tool_action("inventory_check", {"sku": "SKU-1"})
    assert text == '{"tool":"inventory_check","params":{"sku":"SKU-1"}}'
    choice = parse_tool_call(text)
    assert choice is not None
    assert (choice.tool, choice.params) == ("inventory_check", {"sku": "SKU-1"})
    assert parse_final(text) is None
    assert parse_final(final_action('He said "ok", 3 units')) == 'He said "ok", 3 units'
    assert parse_tool_call(final_action("done")) is None
    for junk in ("", "{", '{"final": 3}', '{"final": "x", "extra": 1}'):
        assert parse_final(junk) is None


def test_system_prompt_lists_full_schemas_or_signatures() -> None:
    full = system_prompt("Be kind.", [CONTRACT])
    assert full.startswith("Be kind.")
    assert '{"type":"function","function":{"name":"inventory_check"' in full
    brief = system_prompt("Be kind.", [CONTRACT], full_schemas=False)
    assert brief.endswith("Tools:\ninventory_check(sku)")


def test_tool_message_is_cut_to_its_budget() -> None:
    long = tool_message(tool="t", ok=True, output={"text": "x" * 1000}, max_chars=50)
    assert long.role == "tool"
    assert len(long.content) == 51
    assert long.content.endswith("…")


def test_left_pad_puts_padding_first() -> None:
    ids, mask = left_pad([[1, 2, 3], [4]], pad_id=9)
    assert ids.tolist() == [[1, 2, 3], [9, 9, 4]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_batched_greedy_sampling_matches_one_at_a_time(model_dir: Path) -> None:
    policy = load(model_dir, temperature=0.0, max_new_tokens=10)
    prompts = [policy.encode_prompt(CHAT), policy.encode_prompt(CHAT[1:]), policy.encode_prompt(CHAT)[:-3]]
    together = policy.sample_prompts(prompts)
    alone = [policy.sample_prompts([p])[0] for p in prompts]
    for a, b in zip(together, alone, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_logprobs_are_those_of_the_sampled_tokens_under_the_sampling_distribution(model_dir: Path) -> None:
    policy = load(model_dir, temperature=0.7, max_new_tokens=8)
    (reply,) = policy.generate_now([CHAT])
    assert reply.prompt_token_ids is not None
    assert reply.token_ids is not None
    assert reply.logprobs is not None
    ids = torch.tensor([[*reply.prompt_token_ids, *reply.token_ids]])
    with torch.no_grad():
        logits = policy.model(ids).logits[0, len(reply.prompt_token_ids) - 1 : -1] / 0.7
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(reply.token_ids)[:, None]).squeeze(-1)
    # the default engine multiplies in bfloat16 where the CPU has the units: within 0.02 nats, else exact
    bf16 = isinstance(policy.engine, TorchEngine) and policy.engine.bf16
    assert list(reply.logprobs) == pytest.approx(expected.tolist(), abs=0.02 if bf16 else 1e-4)
    assert reply.tokens_used == len(reply.prompt_token_ids) + len(reply.token_ids)


def test_rows_stop_at_their_first_stop_token_while_the_others_go_on(model_dir: Path) -> None:
    policy = load(model_dir)
    prompts = [policy.encode_prompt(CHAT), policy.encode_prompt(CHAT)[:6], policy.encode_prompt(CHAT[1:])]

    def greedy(stop_ids: frozenset[int]) -> list[tuple[int, ...]]:
        config = SamplingConfig(max_new_tokens=8, temperature=0.0)
        found = sample_batch(
            policy.model, prompts, pad_id=0, stop_ids=stop_ids, config=config, generator=torch.Generator()
        )
        return [s.token_ids for s in found]

    free = greedy(frozenset({-1}))
    stop = free[0][1]  # row 0 stops after two tokens; the other rows leave when (if) they reach it
    stopped = greedy(frozenset({stop}))
    for row, cut in zip(free, stopped, strict=True):
        expected = row[: row.index(stop) + 1] if stop in row else row
        assert cut == expected
    assert stopped[0][-1] == stop
    assert len(stopped[0]) <= 2 < len(free[0])


def test_same_seed_same_samples(model_dir: Path) -> None:
    first = load(model_dir, seed=3, max_new_tokens=8).generate_now([CHAT, CHAT])
    second = load(model_dir, seed=3, max_new_tokens=8).generate_now([CHAT, CHAT])
    assert [r.token_ids for r in first] == [r.token_ids for r in second]


async def test_concurrent_requests_share_batches_and_carry_the_version(model_dir: Path) -> None:
    policy = load(model_dir, max_new_tokens=4)
    policy.version = 7
    replies = await asyncio.gather(*(policy.generate(CHAT, purpose="act") for _ in range(10)))
    assert all(isinstance(r, PolicyReply) and r.policy_version == 7 for r in replies)
    assert all(r.prompt_token_ids == tuple(policy.encode_prompt(CHAT)) for r in replies)
    assert policy.batches < 10
    assert policy.calls == 10


def test_long_conversations_lose_their_oldest_turns(model_dir: Path) -> None:
    policy = load(model_dir)
    turn = [Message(role="assistant", content="x " * 40), Message(role="tool", content="y " * 40)]
    history = [*CHAT, *turn, *turn, Message(role="assistant", content="last")]
    full = len(policy.encode_prompt(history))
    short = HFPolicy(policy.model, policy.tokenizer, SamplingConfig(max_prompt_tokens=full - 1))
    ids = short.encode_prompt(history)
    assert len(ids) < full
    assert short.tokenizer.decode(ids).count("x x") < policy.tokenizer.decode(
        policy.encode_prompt(history)
    ).count("x x")
    tiny = HFPolicy(policy.model, policy.tokenizer, SamplingConfig(max_prompt_tokens=8))
    with pytest.raises(PolicyError, match="max_prompt_tokens=8"):
        tiny.encode_prompt(CHAT)


async def test_a_failing_batch_fails_each_waiter_with_a_policy_error() -> None:
    def broken(items: list[int]) -> list[int]:
        raise RuntimeError("device lost")

    batcher: Batcher[int, int] = Batcher(broken, max_batch=4, gather_ms=1.0)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, PolicyError) and "device lost" in str(r) for r in results)


async def test_batcher_answers_each_request_with_its_own_result() -> None:
    batcher: Batcher[int, int] = Batcher(lambda xs: [x * x for x in xs], max_batch=3, gather_ms=2.0)
    assert await asyncio.gather(*(batcher.submit(i) for i in range(7))) == [i * i for i in range(7)]
    assert max(batcher.sizes) <= 3
    assert sum(batcher.sizes) == 7


def test_lora_adapts_only_the_top_blocks(model_dir: Path) -> None:
    policy = load(model_dir)
    model = with_lora(policy.model, LoRAConfig(rank=2, top_blocks=1))
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable
    assert all("lora_" in name for name in trainable)
    assert all(".layers.1." in name for name in trainable)  # two blocks: only the last is adapted
