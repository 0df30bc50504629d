"""A judge backed by a local Hugging Face causal LM (loaded from a path with `load_policy`; nothing is
downloaded; on the first GPU when there is one).

The model is prompted with `judge_messages` (through the tokenizer's chat template when it has one) and
decoded greedily; its reply must be the JSON `parse_reply` accepts. Loading happens on first use, so
building the judge is cheap and a broken model path surfaces as a `JudgeError` the runner falls back from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sessionrl.rewards.judge.base import JudgeError, judge_messages, parse_reply
from sessionrl.rewards.judge.table import Correction, PenaltyTable


class HFJudge:
    """Comment understanding with a local causal LM."""

    def __init__(self, path: Path, *, max_new_tokens: int = 96, max_time_s: float = 20.0) -> None:
        self.path = path
        self.max_new_tokens = max_new_tokens
        self.max_time_s = max_time_s
        self._loaded: tuple[Any, Any] | None = None

    @property
    def name(self) -> str:
        return f"hf:{self.path}"

    def extract(self, comment: str, table: PenaltyTable) -> tuple[Correction, ...]:
        """Prompt the model and parse its reply; any failure is a `JudgeError`."""
        return parse_reply(self.generate(self.prompt(comment, table)))

    def prompt(self, comment: str, table: PenaltyTable) -> str:
        """The text given to the model: the chat template applied to the judge messages, or a plain join."""
        _, tokenizer = self._load()
        messages = judge_messages(comment, table)
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return str(text)
        return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\n\nassistant: "

    def generate(self, prompt: str) -> str:
        """Greedy continuation of `prompt`, at most `max_new_tokens` tokens and `max_time_s` seconds."""
        model, tokenizer = self._load()
        try:
            import torch

            inputs = tokenizer(prompt, return_tensors="pt").to(model.device)
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            with torch.no_grad():
                out = model.generate(
                    **inputs,
                    max_new_tokens=self.max_new_tokens,
                    max_time=self.max_time_s,
                    do_sample=False,
                    pad_token_id=pad,
                )
            new_tokens = out[0, inputs["input_ids"].shape[1] :]
            return str(tokenizer.decode(new_tokens, skip_special_tokens=True))
        except Exception as exc:  # a third-party model can fail in many ways; all of them mean "fall back"
            raise JudgeError(f"generation failed: {exc}") from exc

    def _load(self) -> tuple[Any, Any]:
        if self._loaded is None:
            try:
                from sessionrl.policy.tiny import load_policy

                self._loaded = load_policy(self.path)
            except Exception as exc:  # missing files, bad config, unknown architecture
                raise JudgeError(f"cannot load the model: {exc}") from exc
        return self._loaded
