"""The GPU engine: a vLLM server (OpenAI-compatible) asked for token ids and logprobs.

`VLLMEngine` implements `sessionrl.policy.engine.Engine` over HTTP. Each prompt is one request to
``POST {url}/v1/completions`` with the prompt as token ids, so the server samples from exactly the tokens
the trainer will score, and asks for what the trainer needs back::

    {"model": "<served name>", "prompt": [ids...], "max_tokens": N, "temperature": T, "seed": S,
     "stop_token_ids": [...], "logprobs": 1, "return_tokens_as_token_ids": true, "return_token_ids": true,
     "skip_special_tokens": false}

and reads ``choices[0].token_ids`` (or, from servers without ``return_token_ids``, the ``token_id:<id>``
strings of ``logprobs.tokens``) and ``choices[0].logprobs.token_logprobs``. The prompts of a batch go out
concurrently (the server batches them itself, with its own prefix cache); each gets its own seed drawn
from the caller's generator, so the K identical prompts of a GRPO group still sample K different replies.

The logprobs must be those of the distribution the tokens were drawn from (softmax of logits /
temperature): start vLLM with ``--logprobs-mode processed_logprobs`` (the default, ``raw_logprobs``, gives
the logprobs before temperature, which differ whenever the temperature is not 1).

Weight refresh is LoRA hot-loading: on the first batch after `refresh`, the model's adapters are saved
to ``{adapters}/v{version}`` (a folder the server can read) and loaded with ``POST
/v1/load_lora_adapter``; replies then name that adapter, and the previous one is unloaded. The server
needs ``--enable-lora --max-lora-rank R`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``. A model without
adapters can only be served as the server's base weights: refreshing it to another version raises, since
new full weights need the server restarted on the exported checkpoint.

Transient failures (connection errors, 429, 5xx) are retried `retries` times with exponential backoff;
then, or at once for any other error, the batch fails with `PolicyError` saying what the server said.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import torch
from pydantic import BaseModel, ConfigDict, Field

from sessionrl.orchestrator.policy import PolicyError
from sessionrl.policy.engine import Completion

if TYPE_CHECKING:
    from sessionrl.policy.llm import SamplingConfig

log = logging.getLogger(__name__)

TOKEN_ID_PREFIX = "token_id:"
"""How vLLM writes a token in ``logprobs.tokens`` when asked ``return_tokens_as_token_ids``."""
RETRIED = frozenset({429, 500, 502, 503, 504})
"""HTTP statuses worth another try."""


class VLLMSettings(BaseModel):
    """Where the vLLM server is and how to talk to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="Base URL of the server, e.g. http://gpu-1:8000 (without /v1).")
    model: str = Field(
        description="The base model's name as the server serves it (vllm serve's --served-model-name)."
    )
    adapters: Path = Field(
        default=Path("adapters"),
        description="Folder the LoRA adapters are saved to; the server must read the same path.",
    )
    adapter_prefix: str = Field(default="policy", description="Adapters are served as <prefix>-v<version>.")
    timeout_s: float = Field(default=120.0, gt=0, description="Longest wait for one response.")
    retries: int = Field(default=3, ge=0, description="Further tries of a request that failed transiently.")
    backoff_s: float = Field(default=0.5, ge=0, description="First wait before a retry; doubled each time.")
    concurrency: int = Field(default=64, ge=1, description="Requests in flight at once.")
    api_key: str | None = Field(default=None, description="Bearer token, when the server wants one.")


def token_ids_of(choice: dict[str, Any]) -> list[int]:
    """The completion's token ids: ``token_ids`` when the server returned them, else read from the
    ``token_id:<id>`` strings of its logprobs.

    >>> token_ids_of({"logprobs": {"tokens": ["token_id:5", "token_id:2"]}})
    [5, 2]
    """
    if choice.get("token_ids") is not None:
        return [int(t) for t in choice["token_ids"]]
    tokens = (choice.get("logprobs") or {}).get("tokens") or []
    if not all(isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        raise PolicyError(
            "the server returned neither token_ids nor token_id:<id> tokens: it must support "
            "return_token_ids or return_tokens_as_token_ids (vLLM does)"
        )
    return [int(t[len(TOKEN_ID_PREFIX) :]) for t in tokens]


def completion_of(body: dict[str, Any], prompt: Sequence[int], version: int) -> Completion:
    """The `Completion` a ``/v1/completions`` response body holds for `prompt`."""
    choices = body.get("choices") or []
    if len(choices) != 1:
        raise PolicyError(f"expected one choice from the server, got {len(choices)}")
    choice = choices[0]
    ids = token_ids_of(choice)
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    if logprobs is None or len(logprobs) != len(ids) or any(lp is None for lp in logprobs):
        raise PolicyError(
            f"the server returned {len(ids)} tokens but logprobs {logprobs!r:.80}: ask with logprobs >= 0"
        )
    echoed = choice.get("prompt_token_ids")
    if echoed is not None and list(echoed) != list(prompt):
        raise PolicyError("the server's prompt_token_ids differ from the prompt sent")
    return Completion(tuple(prompt), tuple(ids), tuple(float(lp) for lp in logprobs), version)


class VLLMEngine:
    """An `Engine` over a vLLM server (see the module doc)."""

    def __init__(
        self,
        settings: VLLMSettings,
        *,
        stop_ids: frozenset[int],
        version: int = 0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.stop_ids = stop_ids
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self.client = httpx.Client(
            base_url=settings.url.rstrip("/"),
            timeout=settings.timeout_s,
            headers=headers,
            transport=transport,
        )
        self._policy_version = version
        self._served = settings.model
        self._pending: tuple[Any, int] | None = None
        self.retried = 0
        """Requests sent again after a transient failure."""
        self.refresh_seconds: list[float] = []
        """How long each adapter hot-load took (save and load)."""

    @property
    def version(self) -> int:
        """The policy version of the weights the next batch samples with."""
        return self._pending[1] if self._pending is not None else self._policy_version

    @property
    def served(self) -> str:
        """The model name requests carry: the base model, or the adapter of the current version."""
        return self._served

    def refresh(self, model: Any, version: int) -> None:
        """Serve `model` as `version` from the next batch on (its adapters are pushed then)."""
        self._pending = (model, version)

    def release(self) -> None:
        """Nothing to give back here: the server keeps its own caches, on its own device."""

    def sample(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, generator: torch.Generator
    ) -> list[Completion]:
        """One request per prompt, sent concurrently; a reply per prompt, in order."""
        self.push()
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator).tolist()
        bodies = [self.request(p, sampling, seed) for p, seed in zip(prompts, seeds, strict=True)]
        with ThreadPoolExecutor(max_workers=min(self.settings.concurrency, len(prompts))) as pool:
            answers = list(pool.map(lambda body: self.post("/v1/completions", body), bodies))
        return [completion_of(a, p, self._policy_version) for a, p in zip(answers, prompts, strict=True)]

    def request(self, prompt: Sequence[int], sampling: SamplingConfig, seed: int) -> dict[str, Any]:
        """The ``/v1/completions`` body continuing `prompt`."""
        return {
            "model": self._served,
            "prompt": list(prompt),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "seed": seed,
            "stop_token_ids": sorted(self.stop_ids),
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }

    def push(self) -> None:
        """Load the adapters of a pending refresh into the server (see the module doc)."""
        if self._pending is None:
            return
        model, version = self._pending
        started = time.perf_counter()
        if hasattr(model, "peft_config"):
            folder = self.settings.adapters / f"v{version}"
            model.save_pretrained(folder)
            name = f"{self.settings.adapter_prefix}-v{version}"
            previous = self._served
            if previous == name:  # the same version's weights again (a module swapped in): replace them
                self.post("/v1/unload_lora_adapter", {"lora_name": name})
            self.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder.resolve())})
            self._served = name
            if previous not in (self.settings.model, name):
                self.post("/v1/unload_lora_adapter", {"lora_name": previous})
        elif version != self._policy_version:
            raise PolicyError(
                f"cannot serve version {version} of a model without LoRA adapters from vLLM: new full "
                "weights need the server restarted on the exported checkpoint (or train with model.lora)"
            )
        self._policy_version, self._pending = version, None
        self.refresh_seconds.append(time.perf_counter() - started)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` as JSON; the JSON answer (an empty dict for a non-JSON success). Transient failures
        are retried; the last, or any other, raises `PolicyError`."""
        wait = self.settings.backoff_s
        for attempt in range(self.settings.retries + 1):
            try:
                response = self.client.post(path, json=body)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.is_success:
                    return _json(response)
                problem = f"HTTP {response.status_code}: {response.text[:300]}"
                if response.status_code not in RETRIED:
                    raise PolicyError(f"vLLM {path} refused the request: {problem}")
            if attempt < self.settings.retries:
                self.retried += 1
                log.warning("vLLM %s failed (%s); retrying in %.2f s", path, problem, wait)
                time.sleep(wait)
                wait *= 2
        raise PolicyError(f"vLLM {path} failed {self.settings.retries + 1} times; last: {problem}")

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {"data": data}


__all__ = ["RETRIED", "VLLMEngine", "VLLMSettings", "completion_of", "token_ids_of"]
