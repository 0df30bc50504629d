"""Running a judge: choosing the backend, caching by content hash, and falling back when it fails.

The runner asks the configured backend; if that raises `JudgeError` (an error, a timeout, an unparseable
reply) it answers with the offline extractor instead and says so in `Judgement.fallback`. Answers of the
configured backend are cached under the hash of (backend, penalty table, comment); fallback answers are
not, so a backend that recovers is asked again.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sessionrl.rewards.judge.base import Judge, JudgeError
from sessionrl.rewards.judge.endpoint import EndpointJudge
from sessionrl.rewards.judge.hf import HFJudge
from sessionrl.rewards.judge.offline import OfflineJudge
from sessionrl.rewards.judge.table import Correction, PenaltyTable


class Backend(StrEnum):
    """Which judge understands comments."""

    OFFLINE = "offline"
    HF = "hf"
    OPENAI = "openai"


class JudgeConfig(BaseModel):
    """How comments are judged."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Backend = Field(
        default=Backend.OFFLINE, description="offline rules, local HF model, or endpoint."
    )
    model_path: Path | None = Field(default=None, description="Local model folder (backend hf).")
    base_url: str | None = Field(default=None, description="Endpoint root, e.g. http://127.0.0.1:8000.")
    model: str = Field(default="judge", description="Model name sent to the endpoint.")
    api_key_env: str = Field(default="SESSIONRL_JUDGE_API_KEY", description="Env var holding the API key.")
    timeout_s: float = Field(default=20.0, gt=0, description="Per-comment limit for model judges.")
    cache_size: int = Field(default=10_000, ge=0, description="Judgements kept in memory.")

    @model_validator(mode="after")
    def _backend_needs(self) -> JudgeConfig:
        if self.backend is Backend.HF and self.model_path is None:
            raise ValueError("the hf judge needs model_path")
        if self.backend is Backend.OPENAI and not self.base_url:
            raise ValueError("the openai judge needs base_url")
        return self


def build_judge(config: JudgeConfig) -> Judge:
    """The backend a config names."""
    if config.backend is Backend.HF:
        assert config.model_path is not None  # checked by the config
        return HFJudge(config.model_path, max_time_s=config.timeout_s)
    if config.backend is Backend.OPENAI:
        assert config.base_url is not None
        key = os.environ.get(config.api_key_env)
        return EndpointJudge(config.base_url, config.model, api_key=key, timeout_s=config.timeout_s)
    return OfflineJudge()


@dataclass(frozen=True)
class Judgement:
    """Corrections for one comment, who produced them, and why the configured backend was not used."""

    corrections: tuple[Correction, ...]
    backend: str
    fallback: str | None = None


class JudgeRunner:
    """A backend with a bounded content-hash cache and the offline extractor as fallback."""

    def __init__(self, backend: Judge | None = None, *, cache_size: int = 10_000) -> None:
        self.offline = OfflineJudge()
        self.backend: Judge = backend or self.offline
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Judgement] = OrderedDict()

    @classmethod
    def from_config(cls, config: JudgeConfig) -> JudgeRunner:
        return cls(build_judge(config), cache_size=config.cache_size)

    def judge(self, comment: str, table: PenaltyTable) -> Judgement:
        """The corrections in `comment`, from the cache, the backend, or the fallback."""
        key = hashlib.sha256(f"{self.backend.name}\0{table.digest}\0{comment}".encode()).hexdigest()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        try:
            result = Judgement(self.backend.extract(comment, table), self.backend.name)
        except JudgeError as exc:
            reason = f"{self.backend.name} failed: {exc}"
            return Judgement(self.offline.extract(comment, table), self.offline.name, fallback=reason)
        self._remember(key, result)
        return result

    def _remember(self, key: str, result: Judgement) -> None:
        if self.cache_size <= 0:
            return
        self._cache[key] = result
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
