"""onnxruntime-genai as a CPU engine: the trainer's checkpoint converted once to ONNX (float32), its LoRA
adapters hot-loaded after every update.

`convert` runs onnxruntime-genai's model builder (its command line) on a Hugging Face checkpoint folder.
With LoRA, the builder is given the policy's adapter folder, so the graph holds LoRA matrices as named
weights; `convert` then declares each as a graph input, which makes it overridable at run time: an
adapter file (`.onnx_adapter`, written with onnxruntime's `AdapterFormat`) of new values replaces them
for the generators that activate it. That is the refresh: `OrtGenAIEngine.refresh` writes the policy's
current LoRA weights (B scaled by peft's alpha / rank, both transposed to the builder's layout) and
loads them under the new version's name. A policy without LoRA cannot be refreshed without converting
the whole model again (minutes), which the engine refuses rather than serve stale weights.

`OrtGenAIEngine.sample` continues a batch in one generator: prompts right-padded with `pad_id` (which
must occur in no prompt: a prompt holding it is sampled alone), logprobs computed from the logits the
generator returns at every step (the first step's at each row's last prompt token), drawn greedily or
from softmax(logits / temperature) with the full vocabulary (top-k off, top-p 1). It keeps nothing
between batches: every turn prefills its whole conversation. Measured on SmolLM2 retail episodes of 3
turns it was as fast as the torch engine, not faster (docs/engines.md), which stays the default.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from sessionrl.orchestrator.policy import PolicyError
from sessionrl.policy.engine import Completion

if TYPE_CHECKING:
    from sessionrl.policy.llm import HFPolicy, SamplingConfig

log = logging.getLogger(__name__)

PEFT_KEY = re.compile(r"layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
"""A peft LoRA weight: layer, block, projection, A or B."""
ONNX_KEY = "model.layers.{layer}.{block}.{proj}.lora_{ab}.MatMul.weight"
"""The builder's name for the same weight (attention blocks are `attn`)."""
LORA_INPUTS = "lora_inputs.json"
"""The converted folder's list of LoRA weights declared as graph inputs."""


def convert(
    checkpoint: Path, folder: Path, *, pad_id: int, adapters: Path | None = None, threads: int = 0
) -> Path:
    """The onnxruntime-genai float32 model of `checkpoint`, built into `folder` (kept: a folder already
    built is returned as it is). With `adapters` (a peft adapter folder over that checkpoint) its LoRA
    weights become run-time inputs. `pad_id` pads batches (`pick_pad`); `threads`: intra-op threads of
    the session (0: onnxruntime's)."""
    if (folder / "genai_config.json").is_file():
        return folder
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint)]
    command += ["-o", str(folder), "-p", "fp32", "-e", "cpu", "-c", str(folder / ".builder-cache")]
    if adapters is not None:
        command += ["--extra_options", f"adapter_path={adapters}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not (folder / "genai_config.json").is_file():
        raise PolicyError(f"onnxruntime-genai's builder failed on {checkpoint}: {done.stderr[-1500:]}")
    if adapters is not None:
        declare_lora_inputs(folder / "model.onnx")
    settings = json.loads((folder / "genai_config.json").read_text())
    settings["model"]["pad_token_id"] = pad_id
    if threads:
        settings["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
    (folder / "genai_config.json").write_text(json.dumps(settings, indent=2))
    return folder


def declare_lora_inputs(model_file: Path) -> list[str]:
    """Declare every LoRA weight of the graph as an input of the same name and shape (its stored value
    stays the default), so an adapter can replace it; the names are written beside the model."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(model_file), load_external_data=False)
    inputs = {i.name for i in graph.graph.input}
    names = []
    for weight in graph.graph.initializer:
        if ".lora_" in weight.name and weight.name not in inputs:
            value = helper.make_tensor_value_info(weight.name, weight.data_type, list(weight.dims))
            graph.graph.input.append(value)
            names.append(weight.name)
    if not names:
        raise PolicyError(f"{model_file} holds no LoRA weights to declare")
    onnx.save(graph, str(model_file))
    (model_file.parent / LORA_INPUTS).write_text(json.dumps(sorted(names)))
    return names


def lora_values(model: Any) -> dict[str, np.ndarray[Any, Any]]:
    """The peft `model`'s LoRA weights under the builder's names: A as ``[in, r]``, B as ``[r, out]``
    times peft's scaling (alpha / r, or alpha / sqrt(r) with rsLoRA)."""
    from peft import get_peft_model_state_dict

    config = model.peft_config["default"]
    scaling = config.lora_alpha / (math.sqrt(config.r) if config.use_rslora else config.r)
    values: dict[str, np.ndarray[Any, Any]] = {}
    for key, weight in get_peft_model_state_dict(model).items():
        found = PEFT_KEY.search(key)
        if found is None:
            raise PolicyError(f"a LoRA weight onnxruntime-genai cannot place: {key}")
        layer, block, proj, ab = found.groups()
        matrix = weight.detach().float().cpu().numpy().T * (scaling if ab == "B" else 1.0)
        name = ONNX_KEY.format(layer=layer, block="attn" if block == "self_attn" else block, proj=proj, ab=ab)
        values[name] = np.ascontiguousarray(matrix, dtype=np.float32)
    return values


def write_adapter(values: dict[str, np.ndarray[Any, Any]], path: Path) -> Path:
    """Write LoRA weights as an onnxruntime adapter file."""
    import onnxruntime as ort

    adapter = ort.AdapterFormat()
    adapter.set_adapter_version(1)
    adapter.set_model_version(1)
    adapter.set_parameters({k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in values.items()})
    adapter.export_adapter(str(path))
    return path


def pick_pad(tokenizer: Any, stop_ids: frozenset[int]) -> int:
    """A token id to pad batches with: the tokenizer's pad token unless it stops replies (chat models
    often pad with their end-of-turn token, which every prompt holds), else the first id that does not."""
    candidates = [tokenizer.pad_token_id, 0, len(tokenizer) - 1]
    return next(int(c) for c in candidates if c is not None and int(c) not in stop_ids)


def converted_folder(checkpoint: Path, cache: Path, *, lora: bool) -> Path:
    """Where `checkpoint`'s conversion is kept: named by its path and its weights' sizes and times."""
    stamp = [str(checkpoint.resolve()), str(lora)]
    for weights in sorted(checkpoint.glob("*.safetensors")):
        info = weights.stat()
        stamp += [weights.name, str(info.st_size), str(info.st_mtime_ns)]
    digest = hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:12]
    return cache / f"{checkpoint.name}-ort-{digest}"


class OrtGenAIEngine:
    """An `Engine` over an onnxruntime-genai model (see the module doc)."""

    def __init__(self, folder: Path, *, stop_ids: frozenset[int], version: int = 0) -> None:
        import onnxruntime_genai as og

        self.folder = folder
        self.model = og.Model(og.Config(str(folder)))
        settings = json.loads((folder / "genai_config.json").read_text())["model"]
        self.vocab_size, self.pad_id = int(settings["vocab_size"]), int(settings["pad_token_id"])
        self.adapters = og.Adapters(self.model)
        lora_file = folder / LORA_INPUTS
        self.lora_inputs = (
            frozenset(json.loads(lora_file.read_text())) if lora_file.is_file() else frozenset()
        )
        self.stop_ids = stop_ids
        self._policy_version = version
        self._active: str | None = None
        self._pending: tuple[Any, int] | None = None
        self.refresh_seconds: list[float] = []
        """How long each adapter hot-load took (export and load)."""
        self.alone = 0
        """Prompts sampled alone because they hold the pad id."""

    @classmethod
    def for_checkpoint(
        cls,
        checkpoint: Path,
        model: Any,
        cache: Path,
        *,
        stop_ids: frozenset[int],
        pad_id: int,
        version: int = 0,
    ) -> OrtGenAIEngine:
        """The engine over `checkpoint` (converted into `cache` on first use, padding with `pad_id`)
        serving `model` (the checkpoint's module, with LoRA adapters or not) as `version`."""
        lora = hasattr(model, "peft_config")
        folder = converted_folder(checkpoint, cache, lora=lora)
        with tempfile.TemporaryDirectory() as tmp:
            adapters = None
            if lora and not (folder / "genai_config.json").is_file():
                adapters = Path(tmp)
                model.save_pretrained(adapters)
            convert(checkpoint, folder, pad_id=pad_id, adapters=adapters, threads=torch.get_num_threads())
        engine = cls(folder, stop_ids=stop_ids, version=version)
        engine.refresh(model, version)
        return engine

    @property
    def version(self) -> int:
        """The policy version of the weights the next batch samples with."""
        return self._pending[1] if self._pending is not None else self._policy_version

    def refresh(self, model: Any, version: int) -> None:
        """Serve `model` as `version` from the next batch on (its LoRA weights are loaded then)."""
        self._pending = (model, version)

    def release(self) -> None:
        """Nothing to give back: each batch's state lives only while the batch generates."""

    def push(self) -> None:
        """Load the LoRA weights of a pending refresh (see the module doc)."""
        if self._pending is None:
            return
        model, version = self._pending
        started = time.perf_counter()
        if hasattr(model, "peft_config") and self.lora_inputs:
            values = lora_values(model)
            missing = set(values) ^ self.lora_inputs
            if missing:
                raise PolicyError(f"LoRA weights and the converted model differ: {sorted(missing)[:4]}")
            name = f"v{version}-{len(self.refresh_seconds)}"
            path = write_adapter(values, self.folder / f"{name}.onnx_adapter")
            self.adapters.load(str(path), name)
            if self._active is not None:
                self.adapters.unload(self._active)
                (self.folder / f"{self._active}.onnx_adapter").unlink(missing_ok=True)
            self._active = name
        elif version != self._policy_version:
            raise PolicyError(
                f"cannot serve version {version} through onnxruntime-genai without LoRA adapters: new full "
                "weights need the model converted again (train with model.lora, or model.engine: torch)"
            )
        self._policy_version, self._pending = version, None
        self.refresh_seconds.append(time.perf_counter() - started)

    def sample(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, generator: torch.Generator
    ) -> list[Completion]:
        """Continue `prompts` (one generator for those without the pad id, one each for the others)."""
        self.push()
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        plain = [i for i, p in enumerate(prompts) if self.pad_id not in p]
        rows: dict[int, list[tuple[int, float]]] = {}
        if plain:
            rows |= dict(zip(plain, self._generate([prompts[i] for i in plain], sampling, seed), strict=True))
        for i in sorted(set(range(len(prompts))) - set(plain)):
            self.alone += 1
            rows[i] = self._generate([prompts[i]], sampling, seed + i)[0]
        return [
            Completion(
                tuple(p), tuple(t for t, _ in rows[i]), tuple(lp for _, lp in rows[i]), self._policy_version
            )
            for i, p in enumerate(prompts)
        ]

    def _generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, seed: int
    ) -> list[list[tuple[int, float]]]:
        """Each prompt's drawn tokens and their logprobs, up to a stop token or `max_new_tokens`."""
        import onnxruntime_genai as og

        width = max(len(p) for p in prompts)
        params = og.GeneratorParams(self.model)
        options: dict[str, Any] = {"max_length": width + sampling.max_new_tokens, "batch_size": len(prompts)}
        options |= {
            "do_sample": not sampling.greedy,
            "top_k": self.vocab_size,
            "top_p": 1.0,
            "random_seed": seed,
        }
        if not sampling.greedy:
            options["temperature"] = sampling.temperature
        params.set_search_options(**options)
        gen = og.Generator(self.model, params)
        if self._active is not None:
            gen.set_active_adapter(self.adapters, self._active)
        gen.append_tokens(np.asarray([list(p) + [self.pad_id] * (width - len(p)) for p in prompts], np.int32))
        last = np.asarray([len(p) - 1 for p in prompts])
        rows: list[list[tuple[int, float]]] = [[] for _ in prompts]
        done = np.zeros(len(prompts), dtype=bool)
        scale = 1.0 if sampling.greedy else 1.0 / sampling.temperature
        while not done.all() and not gen.is_done():
            gen.generate_next_token()
            logits = gen.get_output("logits")
            step = logits[np.arange(len(prompts)), last] if logits.shape[1] > 1 else logits[:, -1]
            logprobs = log_softmax(np.asarray(step, dtype=np.float64) * scale)
            for i, token in enumerate(gen.get_next_tokens().tolist()):
                if not done[i]:
                    rows[i].append((int(token), float(logprobs[i, token])))
                    done[i] = token in self.stop_ids or len(rows[i]) >= sampling.max_new_tokens
        return rows


def for_policy(policy: HFPolicy, checkpoint: Path, cache: Path | None = None) -> OrtGenAIEngine:
    """The engine serving `policy` (whose base weights are `checkpoint`'s) at its current version; the
    conversion is kept in `cache` (default: the model cache, `sessionrl.policy.sources`)."""
    from sessionrl.policy.sources import default_cache

    return OrtGenAIEngine.for_checkpoint(
        checkpoint,
        policy.model,
        cache or default_cache(),
        stop_ids=policy.stop_ids,
        pad_id=pick_pad(policy.tokenizer, policy.stop_ids),
        version=policy.version,
    )


def log_softmax(logits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Log-softmax over the last axis, computed stably.

    >>> [round(float(x), 4) for x in log_softmax(np.array([[0.0, math.log(3.0)]]))[0]]
    [-1.3863, -0.2877]
    """
    top = logits.max(axis=-1, keepdims=True)
    result: np.ndarray[Any, Any] = logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
    return result


__all__ = [
    "OrtGenAIEngine",
    "convert",
    "converted_folder",
    "declare_lora_inputs",
    "for_policy",
    "log_softmax",
    "lora_values",
    "pick_pad",
    "write_adapter",
]
