"""A judge behind any OpenAI-compatible chat endpoint (`POST {base_url}/v1/chat/completions`)."""

from __future__ import annotations

import httpx

from sessionrl.rewards.judge.base import JudgeError, judge_messages, parse_reply
from sessionrl.rewards.judge.table import Correction, PenaltyTable


class EndpointJudge:
    """Comment understanding by a served chat model; greedy decoding, a hard timeout per request."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 20.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    @property
    def name(self) -> str:
        return f"openai:{self.model}@{self.base_url}"

    def extract(self, comment: str, table: PenaltyTable) -> tuple[Correction, ...]:
        """Ask the endpoint, parse the first choice; HTTP errors, timeouts, odd bodies are `JudgeError`."""
        body = {"model": self.model, "messages": judge_messages(comment, table), "temperature": 0.0}
        try:
            response = self._client.post("/v1/chat/completions", json=body)
            response.raise_for_status()
            content = response.json()["choices"][0]["message"]["content"]
        except httpx.HTTPError as exc:
            raise JudgeError(f"{type(exc).__name__}: {exc}") from exc
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise JudgeError(f"unexpected response body: {exc!r}") from exc
        if not isinstance(content, str):
            raise JudgeError("message content is not text")
        return parse_reply(content)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()
