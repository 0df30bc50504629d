"""Checkpoints that resume a run exactly: weights, optimiser, loop state, change-feed cursor, RNG states.

A checkpoint is a folder::

    model/                 the model as `save_pretrained` writes it: `from_pretrained` loads it; with LoRA
                           adapters, the adapters in peft's layout (`PeftModel.from_pretrained` on base/)
    base/                  with LoRA adapters only: the weights they sit on, as `save_pretrained` writes them
    optimizer.pt           the optimiser's state (moments, step counts)
    rng.safetensors        torch's global generator and the sampling generator
    state.json             the loop's own state (`LoopState`: stage, step, policy version, feed cursors,
                           running totals, curve) and Python's `random` state

It is written to a temporary folder and renamed into place, so a crash leaves the previous checkpoint
whole. Loading puts everything back; the next batch read from the feed and the next random draws are
then those an uninterrupted run would have made. A checkpoint from before this layout (one
`model.safetensors` of the model's own state) still loads.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, get_base_model_state_dict, set_base_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, load_model, save_file


class Stage(StrEnum):
    """Where a run of an LLM trainer stands."""

    SFT = "sft"
    """Imitation (the whole of an `sft` run)."""
    RL = "rl"
    """Reinforcement learning, after the imitation policy cleared the gate."""
    STOPPED = "stopped"
    """The imitation policy did not clear the gate; RL did not start."""
    PAUSED = "paused"
    """RL stopped early because the policy collapsed (`sessionrl.eval.collapse`); rl_policy/ holds what
    the collapse watch kept, and a resumed run does not train it further."""
    DPO = "dpo"
    """DPO on preference pairs, after imitation."""
    RFT = "rft"
    """Rejection-sampling fine-tuning, after imitation."""


@dataclass(frozen=True, slots=True)
class LoopState:
    """Where a training run stands."""

    stage: Stage = Stage.SFT
    """The stage the run is in (or ended in)."""
    step: int = 0
    """Steps done in the current stage (SFT optimiser steps, or RL iterations)."""
    policy_version: int = 0
    """Version stamped on the policy's replies; raised by every RL update."""
    cursor: int = 0
    """Change-feed cursor of the trainer: every scored change up to it has been read."""
    reward_cursor: int = 0
    """Change-feed cursor of the reward shaper: every change up to it has been scored."""
    updates: int = 0
    """Optimiser steps the RL trainer has taken (its KL coefficient decays with them)."""
    stale: int = 0
    """Scored sessions left out so far for being more than `max_lag` policy versions old."""
    trained_sessions: int = 0
    """Scored sessions trained on so far."""
    curve: tuple[Mapping[str, Any], ...] = ()
    """One record per RL iteration (success, reward, loss, ...), for the learning curve."""

    @classmethod
    def from_json(cls, loop: Mapping[str, Any]) -> LoopState:
        """The state as `save_checkpoint` wrote it; the running totals of older checkpoints (a `counters`
        mapping) are read into their fields."""
        fields = dict(loop)
        fields.update(fields.pop("counters", None) or {})
        return cls(**(fields | {"stage": Stage(fields["stage"]), "curve": tuple(fields["curve"])}))


def save_checkpoint(
    folder: str | Path,
    model: Any,
    optimizer: torch.optim.Optimizer | None,
    state: LoopState,
    generators: Mapping[str, torch.Generator] = {},
) -> Path:
    """Write a checkpoint to `folder` atomically (replacing an older one) and return its path."""
    final = Path(folder)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_weights(model, tmp)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    rng = {"torch": torch.get_rng_state()} | {f"gen.{k}": g.get_state() for k, g in generators.items()}
    save_file(rng, str(tmp / "rng.safetensors"))
    payload = {"loop": asdict(state), "python_random": _python_state(), "saved_at": time.time()}
    (tmp / "state.json").write_text(json.dumps(payload, indent=1))
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(
    folder: str | Path,
    model: Any,
    optimizer: torch.optim.Optimizer | None,
    generators: Mapping[str, torch.Generator] = {},
) -> LoopState:
    """Restore a checkpoint into `model`, `optimizer` and the generators; return the loop state."""
    path = Path(folder)
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"no checkpoint at {path} (state.json missing)")
    load_weights(model, path)
    if optimizer is not None and (path / "optimizer.pt").is_file():
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    rng = load_file(str(path / "rng.safetensors"))
    torch.set_rng_state(rng["torch"])
    for name, generator in generators.items():
        generator.set_state(rng[f"gen.{name}"])
    payload = json.loads((path / "state.json").read_text())
    random.setstate(_python_tuple(payload["python_random"]))
    state = read_state(path)
    assert state is not None  # state.json was checked above
    return state


def save_weights(model: Any, folder: Path) -> None:
    """`model` into `folder/model` (and, with LoRA adapters, the base weights into `folder/base`) in the
    layout transformers and peft load."""
    model.save_pretrained(folder / "model")
    if isinstance(model, PeftModel):
        base: Any = model.get_base_model()  # a transformers model, with the adapters' layers in place
        base.save_pretrained(folder / "base", state_dict=get_base_model_state_dict(model))


def load_weights(model: Any, folder: Path) -> None:
    """Put the weights `save_weights` wrote to `folder` back into `model` (the same architecture, with
    the same adapters, its parameters kept: an optimiser over them stays valid)."""
    device = str(next(model.parameters()).device)
    if (folder / "model.safetensors").is_file():  # the layout before `save_pretrained`
        load_model(model, str(folder / "model.safetensors"), device=device)
        return
    if isinstance(model, PeftModel):
        base = _tensors(folder / "base", device)
        missing = set_base_model_state_dict(model, base, strict=False).missing_keys
        _check_tied(model.get_base_model(), base, missing)
        set_peft_model_state_dict(model, _tensors(folder / "model", device))
        return
    tensors = _tensors(folder / "model", device)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected:
        raise RuntimeError(f"the checkpoint holds weights the model does not have: {unexpected[:5]}")
    _check_tied(model, tensors, missing)


def _tensors(folder: Path, device: str) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files in `folder` (one, or the shards of a large model)."""
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors |= load_file(str(file), device=device)
    if not tensors:
        raise FileNotFoundError(f"no weights in {folder}")
    return tensors


def _check_tied(model: torch.nn.Module, loaded: Mapping[str, torch.Tensor], missing: list[str]) -> None:
    """Refuse a checkpoint that left weights unloaded, except those tied to a loaded one (`save_pretrained`
    stores tied weights once)."""
    state = model.state_dict(keep_vars=True)
    pointers = {state[name].data_ptr() for name in loaded if name in state}
    untied = [name for name in missing if state[name].data_ptr() not in pointers]
    if untied:
        raise RuntimeError(f"the checkpoint lacks weights the model has: {untied[:5]}")


def read_state(folder: str | Path) -> LoopState | None:
    """The loop state of the checkpoint in `folder` (nothing else is loaded), or None without one."""
    path = Path(folder) / "state.json"
    if not path.is_file():
        return None
    loop = json.loads(path.read_text())["loop"]
    return LoopState.from_json(loop)


def saved_at(folder: str | Path) -> float | None:
    """When the checkpoint in `folder` was made (`time.time()`, the clock metrics records carry), or None
    without one. A checkpoint written before this was kept answers with its file's modification time."""
    path = Path(folder) / "state.json"
    if not path.is_file():
        return None
    when = json.loads(path.read_text()).get("saved_at")
    return float(when) if when is not None else path.stat().st_mtime


def has_checkpoint(folder: str | Path) -> bool:
    """True when `folder` holds a complete checkpoint."""
    return (Path(folder) / "state.json").is_file()


def _python_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _python_tuple(saved: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = saved
    return (version, tuple(internal), gauss)


def stamp(*texts: str) -> str:
    """A short digest of `texts`, for the ids of episodes that depend on them: a resumed run reads back an
    episode only when what it depends on (a reflection's text, the trained weights) is the same.

    >>> stamp("a"), stamp("a") == stamp("a"), stamp("a") == stamp("b")
    ('4c368117', True, False)
    """
    digest = hashlib.blake2b(digest_size=4)
    for text in texts:
        digest.update(text.encode() + b"\0")
    return digest.hexdigest()


def weights(model: torch.nn.Module) -> str:
    """A digest of a model's weights, as text for `stamp`."""
    digest = hashlib.blake2b(digest_size=8)
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().float().numpy().tobytes())
    return digest.hexdigest()


__all__ = [
    "LoopState",
    "Stage",
    "has_checkpoint",
    "load_checkpoint",
    "read_state",
    "save_checkpoint",
    "stamp",
    "weights",
]
