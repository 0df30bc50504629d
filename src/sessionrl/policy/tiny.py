"""A tiny chat causal LM built locally: a byte-level BPE tokenizer trained on the domain's own text and a
small Llama-shaped model, saved and loaded exactly like any Hugging Face checkpoint.

The tiny policy exists so the whole loop (imitation, RL, evaluation) runs on a laptop CPU in minutes. Nothing
is downloaded: the tokenizer is trained on the texts it is given (tool schemas, the system prompt, expert
sessions) and the weights start from a seeded random initialisation. :func:`load_policy` reads any local
causal-LM checkpoint, so the same code serves a real model (a local Qwen folder, say) on a GPU.

Chat format (the tokenizer's chat template, used through ``tokenizer.apply_chat_template``), one message per
line, ``↵`` standing for a newline::

    <|bos|><|system|>↵{system prompt}<|end|>↵
    <|user|>↵{request}<|end|>↵
    <|assistant|>↵{reply}<|end|>↵

``<|end|>`` closes every message and is the tokenizer's ``eos_token``, so generation stops at the end of the
assistant's turn. Tool results come back as ``tool`` messages; tool calls are JSON in the assistant's text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

PAD_TOKEN: Final = "<|pad|>"
BOS_TOKEN: Final = "<|bos|>"
END_TOKEN: Final = "<|end|>"
CHAT_ROLES: Final = ("system", "user", "assistant", "tool")
ROLE_TOKENS: Final = {role: f"<|{role}|>" for role in CHAT_ROLES}
SPECIAL_TOKENS: Final = (PAD_TOKEN, BOS_TOKEN, END_TOKEN, *ROLE_TOKENS.values())

CHAT_TEMPLATE: Final = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_BYTE_ALPHABET_SIZE: Final = 256


@dataclass(frozen=True, slots=True)
class TinyModelConfig:
    """Shape of the tiny policy and its tokenizer. Defaults: 1.1–1.5M parameters, by vocabulary size."""

    vocab_size: int = field(
        default=3072, metadata={"help": "BPE vocabulary ceiling, 256 bytes and specials included"}
    )
    min_frequency: int = field(
        default=2, metadata={"help": "fewest occurrences for a BPE merge to be learned"}
    )
    hidden_size: int = field(default=128, metadata={"help": "width of the residual stream"})
    num_layers: int = field(default=4, metadata={"help": "number of transformer blocks"})
    num_heads: int = field(
        default=4, metadata={"help": "attention heads per block (must divide hidden_size)"}
    )
    intermediate_size: int = field(default=512, metadata={"help": "width of the gated MLP inside each block"})
    max_positions: int = field(
        default=2048, metadata={"help": "longest sequence, in tokens, the model accepts"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the weight initialisation"})

    def __post_init__(self) -> None:
        floor = _BYTE_ALPHABET_SIZE + len(SPECIAL_TOKENS)
        if self.vocab_size < floor:
            raise ValueError(f"TinyModelConfig.vocab_size must be at least {floor}, got {self.vocab_size}")
        for name in ("min_frequency", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"TinyModelConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            sizes = f"hidden_size ({self.hidden_size}) must be a multiple of num_heads ({self.num_heads})"
            raise ValueError(f"TinyModelConfig.{sizes}")
        if self.max_positions < 16:
            raise ValueError(f"TinyModelConfig.max_positions must be at least 16, got {self.max_positions}")


def train_tokenizer(texts: Iterable[str], config: TinyModelConfig) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` and wrap it with the chat special tokens and template.

    Byte-level BPE encodes any text (JSON, any script, emoji) without an unknown token, and decodes it back
    unchanged. Each special token is a single id, never split and never produced by the merges.
    """
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=END_TOKEN,
        pad_token=PAD_TOKEN,
        extra_special_tokens=list(ROLE_TOKENS.values()),
        chat_template=CHAT_TEMPLATE,
        model_max_length=config.max_positions,
        clean_up_tokenization_spaces=False,
    )


def build_tiny_model(config: TinyModelConfig, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A freshly initialised Llama-shaped causal LM sized by `config`, with tied input and output embeddings.

    The initialisation is seeded by ``config.seed`` without touching the caller's global RNG state.
    """
    llama = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(llama)
    return model


def build_tiny_policy(
    texts: Iterable[str], config: TinyModelConfig, out_dir: str | Path
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Train the tokenizer on `texts`, build the model, save both to `out_dir` (safetensors) and return them.

    `out_dir` then loads with :func:`load_policy` like any local checkpoint.
    """
    tokenizer = train_tokenizer(texts, config)
    model = build_tiny_model(config, tokenizer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model, tokenizer


def default_placement() -> tuple[torch.device, torch.dtype]:
    """Where to run a policy: the first GPU in bfloat16 when one supports it, else the CPU in float32."""
    if torch.cuda.is_available():
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        return torch.device("cuda"), dtype
    return torch.device("cpu"), torch.float32


def load_policy(
    path: str | Path, device: torch.device | None = None, dtype: torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load a local Hugging Face causal LM and its tokenizer, never reaching a hub.

    `device` and `dtype` default to :func:`default_placement`; the weights load straight onto the device. A
    tokenizer without a pad token gets its eos token as pad, so batches can be padded. The model comes back in
    eval mode, as ``from_pretrained`` leaves it.
    """
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no model checkpoint at {folder} (config.json missing)")
    chosen_device, chosen_dtype = default_placement()
    model = AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, dtype=dtype or chosen_dtype, device_map=device or chosen_device
    )
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
