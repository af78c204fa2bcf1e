"""The built-in model's weights: ``load_tiny()`` returns the trained transformer, its text encoder and
tokenizer, and the stored config; ``save_tiny`` writes them (``make train-tiny``, scripts/train_tiny.py)."""
from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from jensenkv.generation.config import GenerationConfig
from jensenkv.models.tiny.config import (
    CONFIG_FILE,
    TEXT_PREFIX,
    TRANSFORMER_PREFIX,
    WEIGHTS_DIR,
    WEIGHTS_FILE,
    build_transformer,
)
from jensenkv.models.tiny.text import TextConfig, build_text


def split_state(state: dict) -> tuple[dict, dict]:
    """Split a combined state dict into (transformer, text encoder) parts by key prefix."""
    transformer = {k[len(TRANSFORMER_PREFIX):]: v for k, v in state.items() if k.startswith(TRANSFORMER_PREFIX)}
    text = {k[len(TEXT_PREFIX):]: v for k, v in state.items() if k.startswith(TEXT_PREFIX)}
    return transformer, text


def save_tiny(weights_dir: str | Path, transformer: nn.Module, text_encoder: nn.Module, config: dict) -> None:
    """Write model.safetensors (both modules, key-prefixed) and config.json -- the inverse of ``load_tiny``."""
    weights_dir = Path(weights_dir)
    weights_dir.mkdir(parents=True, exist_ok=True)
    state = {TRANSFORMER_PREFIX + k: v.detach().contiguous() for k, v in transformer.state_dict().items()}
    state.update({TEXT_PREFIX + k: v.detach().contiguous() for k, v in text_encoder.state_dict().items()})
    save_file(state, str(weights_dir / WEIGHTS_FILE))
    (weights_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def load_tiny(weights_dir: str | Path | None = None, device: str = "cpu"):
    """Load the tiny model: returns (transformer, text_encoder, tokenizer, config dict), both modules in eval mode.

    config has keys "transformer", "text", "data", "sampler" (see scripts/train_tiny.py).
    """
    weights_dir = Path(weights_dir) if weights_dir is not None else WEIGHTS_DIR
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (weights_dir / name).is_file():
            raise FileNotFoundError(
                f"tiny model file {weights_dir / name} is missing; run `make train-tiny` to train it"
            )
    try:
        config = json.loads((weights_dir / CONFIG_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"tiny model config {weights_dir / CONFIG_FILE} is not valid JSON ({e}); restore it "
                         "or run `make train-tiny`") from None
    transformer = build_transformer(config["transformer"])
    tokenizer, text_encoder = build_text(TextConfig.from_dict(config["text"]))
    try:
        state = load_file(str(weights_dir / WEIGHTS_FILE))
    except SafetensorError as e:  # truncated, garbled or empty: name the file, not a traceback
        raise ValueError(f"tiny model weights {weights_dir / WEIGHTS_FILE} cannot be read, the file is truncated, "
                         f"garbled or empty ({e}); restore it or run `make train-tiny`") from None
    transformer_state, text_state = split_state(state)
    transformer.load_state_dict(transformer_state)
    text_encoder.load_state_dict(text_state)
    transformer.to(device).eval()
    text_encoder.to(device).eval()
    return transformer, text_encoder, tokenizer, config


def sampler_config(config: dict) -> GenerationConfig:
    """The sampler the model card was evaluated with (config.json's "sampler": GenerationConfig fields)."""
    return GenerationConfig(**config["sampler"])

