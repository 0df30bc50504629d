"""External CPU engines measured against the torch engine (issue 31): OpenVINO GenAI and llama.cpp's server.

Both are adapters to `sessionrl.policy.engine.Engine` for measurement only (`bench/engine.py --engine`);
neither is the product's CPU engine (docs/engines.md gives the figures and the reasons):

- `OpenVINOEngine`: an `openvino_genai.ContinuousBatchingPipeline` on a GGUF file, prefix caching on,
  every prompt a request of its own, stepped together; token ids and per-token logprobs come from
  `GenerationOutput.generated_ids` / `generated_log_probs`;
- `LlamaServerEngine`: a `llama-server` process (built from llama.cpp's source) with one slot per row,
  each request pinned to its row's slot with `cache_prompt`, so an episode's next turn prefills only
  what follows its kept prompt and reply; token ids and logprobs from `/completion` with `n_probs: 1`.

Neither is in an extra: `pip install openvino-genai` (201 MB) to measure the first; the second needs
`llama-server` built from llama.cpp's source (see docs/engines.md for the flags used).
Neither can load the trainer's new weights in place: refreshing either means writing the weights out
(a GGUF file) and loading them again, which `refresh` here does not attempt (it raises for a version
other than the one served).
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import torch

from sessionrl.policy.engine import Completion

if TYPE_CHECKING:
    from sessionrl.policy.llm import SamplingConfig

FAITHFUL = {
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
    "INFERENCE_PRECISION_HINT": "f32",
}
"""OpenVINO CPU properties that keep float32 arithmetic (its defaults quantise KV cache and activations)."""


class StaleWeights(RuntimeError):
    """The engine was asked to serve weights it cannot load in place."""


class _Served:
    """The policy version served and the refusal to pretend to serve another."""

    def __init__(self, version: int) -> None:
        self._policy_version = version

    @property
    def version(self) -> int:
        return self._policy_version

    def release(self) -> None:
        """Nothing to give back from here: the pipeline manages its own cache."""

    def refresh(self, model: Any, version: int) -> None:
        if version != self._policy_version:
            raise StaleWeights(f"{type(self).__name__} cannot load version {version}'s weights in place")


class OpenVINOEngine(_Served):
    """OpenVINO GenAI's continuous-batching pipeline over a GGUF file (see the module doc)."""

    def __init__(
        self,
        gguf: Path,
        *,
        stop_ids: frozenset[int],
        threads: int = 2,
        faithful: bool = True,
        cache_gb: int = 2,
        version: int = 0,
    ) -> None:
        import openvino_genai as ov_genai

        super().__init__(version)
        scheduler = ov_genai.SchedulerConfig()
        scheduler.enable_prefix_caching = True
        scheduler.cache_size = cache_gb
        scheduler.max_num_seqs = 64
        scheduler.max_num_batched_tokens = 4096
        properties: dict[str, object] = {"INFERENCE_NUM_THREADS": threads, **(FAITHFUL if faithful else {})}
        started = time.perf_counter()
        self.pipe = ov_genai.ContinuousBatchingPipeline(str(gguf), scheduler, "CPU", properties)
        self.load_seconds = time.perf_counter() - started
        self.stop_ids = stop_ids
        self._next_id = 0

    def sample(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, generator: torch.Generator
    ) -> list[Completion]:
        import openvino as ov

        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator).tolist()
        handles = []
        for prompt, seed in zip(prompts, seeds, strict=True):
            ids = ov.Tensor(np.asarray([list(prompt)], dtype=np.int64))
            handles.append(self.pipe.add_request(self._next_id, ids, self._config(sampling, seed)))
            self._next_id += 1
        while self.pipe.has_non_finished_requests():
            self.pipe.step()
        completions = []
        for prompt, handle in zip(prompts, handles, strict=True):
            out = handle.read_all()[0]
            ids, logprobs = tuple(int(t) for t in out.generated_ids), tuple(out.generated_log_probs)
            completions.append(Completion(tuple(prompt), ids, logprobs, self.version))
        return completions

    def _config(self, sampling: SamplingConfig, seed: int) -> Any:
        import openvino_genai as ov_genai

        config = ov_genai.GenerationConfig()
        config.max_new_tokens = sampling.max_new_tokens
        config.stop_token_ids = set(self.stop_ids)
        config.logprobs = 1
        config.do_sample = not sampling.greedy
        if not sampling.greedy:
            config.temperature = sampling.temperature
            config.top_p, config.top_k, config.rng_seed = 1.0, 0, seed
        return config


class OrtGenAIEngine(_Served):
    """onnxruntime-genai's `Generator` over a model its builder made from the trainer's checkpoint
    (float32): each batch right-padded into one generator, logprobs taken from the logits it returns
    (the first step's at each row's last prompt token). Keeps nothing between batches."""

    def __init__(self, folder: Path, *, stop_ids: frozenset[int], pad_id: int = 0, version: int = 0) -> None:
        import onnxruntime_genai as og

        super().__init__(version)
        started = time.perf_counter()
        self.model = og.Model(og.Config(str(folder)))
        self.load_seconds = time.perf_counter() - started
        self.stop_ids, self.pad_id = stop_ids, pad_id

    def sample(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, generator: torch.Generator
    ) -> list[Completion]:
        import onnxruntime_genai as og

        width = max(len(p) for p in prompts)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        params = og.GeneratorParams(self.model)
        options: dict[str, Any] = {"max_length": width + sampling.max_new_tokens, "batch_size": len(prompts)}
        options |= {"do_sample": not sampling.greedy, "top_k": 0, "top_p": 1.0, "random_seed": seed}
        if not sampling.greedy:
            options["temperature"] = sampling.temperature
        params.set_search_options(**options)
        gen = og.Generator(self.model, params)
        gen.append_tokens(np.asarray([list(p) + [self.pad_id] * (width - len(p)) for p in prompts], np.int32))
        last = np.asarray([len(p) - 1 for p in prompts])
        rows: list[list[tuple[int, float]]] = [[] for _ in prompts]
        done = np.zeros(len(prompts), dtype=bool)
        scale = 1.0 if sampling.greedy else 1.0 / sampling.temperature
        while not gen.is_done() and not done.all():
            gen.generate_next_token()
            logits = gen.get_output("logits")
            step = logits[np.arange(len(prompts)), last] if logits.shape[1] > 1 else logits[:, -1]
            step = step.astype(np.float64) * scale
            top = step.max(-1, keepdims=True)
            norm = np.log(np.exp(step - top).sum(-1)) + top[:, 0]
            tokens = gen.get_next_tokens()
            for i, token in enumerate(tokens.tolist()):
                if done[i]:
                    continue
                rows[i].append((int(token), float(step[i, token] - norm[i])))
                done[i] = token in self.stop_ids or len(rows[i]) >= sampling.max_new_tokens
        return [
            Completion(tuple(p), tuple(t for t, _ in r), tuple(lp for _, lp in r), self.version)
            for p, r in zip(prompts, rows, strict=True)
        ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServerEngine(_Served):
    """A `llama-server` process with a slot per row (see the module doc)."""

    def __init__(
        self,
        binary: Path,
        gguf: Path,
        *,
        stop_ids: frozenset[int],
        slots: int = 16,
        context: int = 4096,
        threads: int = 2,
        version: int = 0,
    ) -> None:
        super().__init__(version)
        self.stop_ids, self.slots = stop_ids, slots
        port = free_port()
        command = [str(binary), "-m", str(gguf), "--port", str(port), "--host", "127.0.0.1"]
        command += ["-np", str(slots), "-c", str(context * slots), "-t", str(threads), "-tb", str(threads)]
        command += [
            "-b",
            "2048",
            "-ub",
            "512",
            "--no-webui",
            "--no-repack",
        ]  # its repacked AMX path crashed here
        started = time.perf_counter()
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600.0)
        self._wait_ready()
        self.load_seconds = time.perf_counter() - started

    def _wait_ready(self) -> None:
        for _ in range(600):
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"llama-server exited: {err[-2000:]}")
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError("llama-server did not start in 120 s")

    def sample(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, generator: torch.Generator
    ) -> list[Completion]:
        if len(prompts) > self.slots:
            raise ValueError(f"{len(prompts)} prompts for {self.slots} slots")
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator).tolist()
        bodies = [
            self._body(p, sampling, seed, slot)
            for slot, (p, seed) in enumerate(zip(prompts, seeds, strict=True))
        ]
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            answers = list(pool.map(lambda b: self.client.post("/completion", json=b), bodies))
        completions = []
        for prompt, answer in zip(prompts, answers, strict=True):
            answer.raise_for_status()
            ids, logprobs = self._tokens(answer.json(), sampling)
            completions.append(Completion(tuple(prompt), ids, logprobs, self.version))
        return completions

    def _body(self, prompt: Sequence[int], sampling: SamplingConfig, seed: int, slot: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": list(prompt),
            "n_predict": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_k": 0,
            "top_p": 1.0,
            "min_p": 0.0,
            "seed": seed,
            "n_probs": 1,
            "post_sampling_probs": False,
            "cache_prompt": True,
            "id_slot": slot,
            "return_tokens": True,
            "samplers": ["temperature"] if not sampling.greedy else [],
        }
        return body

    def _tokens(
        self, answer: dict[str, Any], sampling: SamplingConfig
    ) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Token ids and logprobs of the answer; the stop token (which llama-server leaves out of the
        text) is appended with its logprob when the answer stopped on it."""
        probs = answer.get("completion_probabilities") or []
        ids = tuple(int(p["id"]) for p in probs)
        logprobs = tuple(float(p["logprob"]) for p in probs)
        if sampling.temperature not in (0.0, 1.0):
            raise ValueError("llama-server gives logprobs before temperature: use temperature 0 or 1")
        if math.isnan(sum(logprobs)):
            raise RuntimeError("NaN logprob from llama-server")
        return ids, logprobs

    def server_cpu_seconds(self) -> float:
        """CPU time the server process has used (user and system, all its threads)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.client.close()
        self.process.terminate()
        self.process.wait(timeout=30)
