"""A GRPO iteration whose rollouts sample through the vLLM engine from a simulated vLLM server: the stored
sessions hold the server's token ids and logprobs, and the update reaches the server as the next
version's LoRA adapter, which the next sample carries."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from rich.console import Console
from vllm_sim import VLLMSimulator

from sessionrl.episodes import RolloutConfig
from sessionrl.policy.llm import HFPolicy, LoRAConfig, SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig
from sessionrl.policy.vllm import VLLMSettings
from sessionrl.train.config import EnvSection, EvalSection, ModelSection, RLSection, RunConfig, SFTSection
from sessionrl.train.llm.checkpoint import Stage
from sessionrl.train.llm.grpo import GRPOConfig
from sessionrl.train.llm.imitation import imitation
from sessionrl.train.llm.loop import reinforce, resumed_policy
from sessionrl.train.llm.run import open_run
from sessionrl.train.llm.sft import SFTConfig

SMALL = TinyModelConfig(vocab_size=700, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def vllm_run(folder: Path, url: str) -> RunConfig:
    return RunConfig(
        run_dir=folder / "run",
        env=EnvSection(train=16, dev=4, test=4),
        model=ModelSection(
            tiny=SMALL,
            lora=LoRAConfig(rank=2, alpha=4, top_blocks=1),
            vllm=VLLMSettings(url=url, model="sft", adapters=folder / "adapters", backoff_s=0.0),
        ),
        rollout=RolloutConfig(max_steps=3, full_schemas=False, domain_policy=False, max_tool_chars=120),
        sft=SFTSection(demos=6, trainer=SFTConfig(steps=2, batch_sessions=4, token_budget=4096)),
        rl=RLSection(
            iterations=1,
            tasks_per_iteration=2,
            sampling=SamplingConfig(max_new_tokens=12),
            trainer=GRPOConfig(group_size=2, token_budget=4096),
        ),
        evaluation=EvalSection(tasks=2, gate_tasks=2, max_new_tokens=12),
    )


def test_grpo_stores_the_servers_tokens_and_logprobs_and_serves_the_update(tmp_path: Path) -> None:
    quiet = Console(quiet=True)
    with VLLMSimulator(model=None, served="sft", latency_s=0.005) as server:
        config = vllm_run(tmp_path, server.url)
        with open_run(config) as run:
            imitation(run, quiet, resume=False)
            # the server serves the exported imitation policy, the weights the RL stage starts from
            server.model = HFPolicy.load(config.run_dir / "sft_policy").model.eval()
            server.failures = 1  # one overloaded answer on the way, retried
            run.policy = resumed_policy(run)
            run.state = dataclasses.replace(run.state, stage=Stage.RL, step=0)
            reinforce(run, quiet, resume=False, on_iteration=lambda _: None)
            sessions = [run.store.get(s) for s in run.store.session_ids() if s.startswith("rl-")]
            policy = run.need_policy()
            assert policy.version == 1
            (after,) = policy.sample_prompts([list(sessions[0].llm_calls[0].prompt_token_ids or ())])

    assert len(sessions) == 2 * 2
    answered = {(tuple(a.request["prompt"]), tuple(a.token_ids)): a for a in server.answered}
    calls = [c for s in sessions for c in s.llm_calls]
    assert calls
    for call in calls:
        assert call.prompt_token_ids is not None
        assert call.token_ids is not None
        assert call.logprobs is not None
        sent = answered[(call.prompt_token_ids, call.token_ids)]  # the server answered exactly these tokens
        assert list(call.logprobs) == sent.logprobs
        assert (call.policy_version, sent.request["model"]) == (0, "policy-v0")
    # the update went to the server as version 1's adapter; a sample after it carries that version
    assert [load["lora_name"] for load in server.loads] == ["policy-v0", "policy-v1"]
    assert after.policy_version == 1
    assert server.answered[-1].request["model"] == "policy-v1"


def test_a_vllm_config_needs_lora(tmp_path: Path) -> None:
    model = vllm_run(tmp_path, "http://127.0.0.1:9").model
    with pytest.raises(ValueError, match=r"model\.vllm needs model\.lora"):
        ModelSection(tiny=model.tiny, vllm=model.vllm)
