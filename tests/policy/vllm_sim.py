"""A vLLM server simulator for the engine tests: the endpoints `VLLMEngine` uses, over real HTTP.

It speaks the fields of vLLM's OpenAI-compatible server: ``POST /v1/completions`` with a token-id prompt
(``max_tokens``, ``temperature``, ``seed``, ``stop_token_ids``, ``logprobs``, ``return_token_ids``,
``return_tokens_as_token_ids``) answered with ``choices[0].logprobs.{tokens, token_logprobs,
top_logprobs}``, ``token_ids``, ``prompt_token_ids``, ``finish_reason`` and ``usage``; ``POST
/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (``lora_name``, ``lora_path``), which load a peft
adapter folder onto a copy of the base model; ``GET /v1/models``. It decodes with a small Hugging Face
model, one full forward per token (no cache: it shares nothing with the sampler under test), and its
logprobs are those of the distribution it drew from (vLLM's ``--logprobs-mode processed_logprobs``).

`latency_s` delays every completion; the first `failures` completions answer `failure_status`;
`legacy=True` answers without ``token_ids`` (servers older than ``return_token_ids``), so only the
``token_id:<id>`` strings carry the ids. Every completion it answered is in `answered`.
"""

from __future__ import annotations

import copy
import threading
import time
import warnings
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

import orjson
import torch


@dataclass
class Answered:
    """One completion the simulator sent: the request and the ids and logprobs it answered with."""

    request: dict[str, Any]
    token_ids: list[int]
    logprobs: list[float]


@dataclass(eq=False)
class VLLMSimulator:
    """A threaded HTTP server answering like vLLM (see the module doc); a context manager."""

    model: Any
    served: str = "base"
    latency_s: float = 0.0
    failures: int = 0
    failure_status: int = 503
    legacy: bool = False
    answered: list[Answered] = field(default_factory=list)
    adapters: dict[str, Any] = field(default_factory=dict)
    loads: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start the simulator first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Self:
        sim = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/v1/models":
                    return self.reply(404, {"error": {"message": f"no route {self.path}"}})
                names = [sim.served, *sim.adapters]
                return self.reply(
                    200, {"object": "list", "data": [{"id": n, "object": "model"} for n in names]}
                )

            def do_POST(self) -> None:
                body = orjson.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                try:
                    status, answer = sim.route(self.path, body)
                except Exception as exc:  # a server answers 500 rather than hang up
                    status, answer = 500, error(f"{type(exc).__name__}: {exc}")
                self.reply(status, answer)

            def reply(self, status: int, body: dict[str, Any]) -> None:
                data = orjson.dumps(body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def route(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path == "/v1/completions":
            return self.complete(body)
        if path == "/v1/load_lora_adapter":
            return self.load(body)
        if path == "/v1/unload_lora_adapter":
            with self._lock:
                if self.adapters.pop(str(body.get("lora_name")), None) is None:
                    return 404, error(f"The lora adapter '{body.get('lora_name')}' cannot be found.")
            return 200, {}
        return 404, error(f"no route {path}")

    def load(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        from peft import PeftModel

        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str):
            return 400, error("both 'lora_name' and 'lora_path' must be provided.")
        with self._lock:
            if name in self.adapters:
                return 400, error(f"The lora adapter '{name}' has already been loaded.")
            with warnings.catch_warnings():  # peft probes an attribute transformers has renamed
                warnings.filterwarnings(
                    "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
                )
                adapted = PeftModel.from_pretrained(copy.deepcopy(self.model), path)
            adapted.eval()
            self.adapters[name] = adapted
            self.loads.append(body)
        return 200, {}

    def complete(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        time.sleep(self.latency_s)
        with self._lock:
            if self.failures > 0:
                self.failures -= 1
                return self.failure_status, error("simulated overload")
            model = self.model if body.get("model") == self.served else self.adapters.get(body.get("model"))
        if model is None:
            return 404, error(f"The model `{body.get('model')}` does not exist.")
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return 400, error("this simulator takes token-id prompts only")
        ids, logprobs, finish = decode(model, prompt, body)
        with self._lock:
            self.answered.append(Answered(body, ids, logprobs))
        return 200, self.response(body, prompt, ids, logprobs, finish)

    def response(
        self, body: dict[str, Any], prompt: list[int], ids: list[int], logprobs: list[float], finish: str
    ) -> dict[str, Any]:
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        tokens = [f"token_id:{t}" if as_ids else f"<{t}>" for t in ids]
        choice: dict[str, Any] = {
            "index": 0,
            "text": "",
            "logprobs": {
                "text_offset": list(range(len(ids))),
                "token_logprobs": logprobs,
                "tokens": tokens,
                "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs, strict=True)],
            }
            if body.get("logprobs") is not None
            else None,
            "finish_reason": finish,
            "stop_reason": ids[-1] if finish == "stop" else None,
        }
        if body.get("return_token_ids") and not self.legacy:
            choice |= {"token_ids": ids, "prompt_token_ids": prompt}
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt) + len(ids),
        }
        return {
            "id": f"cmpl-{len(self.answered)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [choice],
            "usage": usage,
        }


def error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError"}}


@torch.inference_mode()
def decode(model: Any, prompt: list[int], body: dict[str, Any]) -> tuple[list[int], list[float], str]:
    """Tokens drawn one full forward at a time, with their logprobs under the distribution drawn from."""
    temperature = float(body.get("temperature", 1.0))
    stops = set(body.get("stop_token_ids") or [])
    generator = torch.Generator().manual_seed(int(body.get("seed") or 0))
    ids, out, logprobs = list(prompt), [], []
    for _ in range(int(body.get("max_tokens", 16))):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        if temperature == 0:
            logp = torch.log_softmax(logits, -1)
            token = int(logp.argmax())
        else:
            logp = torch.log_softmax(logits / temperature, -1)
            token = int(torch.multinomial(logp.exp(), 1, generator=generator))
        ids.append(token)
        out.append(token)
        logprobs.append(float(logp[token]))
        if token in stops:
            return out, logprobs, "stop"
    return out, logprobs, "length"
