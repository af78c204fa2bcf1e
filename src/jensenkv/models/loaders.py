"""Loaders for real Wan-family checkpoints (SkyReels-V2, Wan2.1 / Self-Forcing); ``wan.build`` assembles them.

They never touch the network: a local directory (or the Hugging Face cache) is resolved first, and a
``MissingWeightsError`` names where the weights were looked for and how to fetch them.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from jensenkv.models.finite_weights import check_finite_weights
from jensenkv.models.wan.names import TRANSFORMER_CLASS_NAMES
FETCH_HINT = "run `make fetch-weights` on a machine with internet (or copy the files there), then retry"
CHECKPOINT_PREFIXES = ("model.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


class MissingWeightsError(FileNotFoundError):
    """Model weights are not on this machine (the suite never downloads them at run time)."""


def transformer_classes() -> dict[str, type]:
    """Name -> diffusers class, for ``TRANSFORMER_CLASS_NAMES`` (imports diffusers, about 5 s CPU: only when a
    Wan-family checkpoint loads)."""
    import diffusers

    return {name: getattr(diffusers, name) for name in TRANSFORMER_CLASS_NAMES}


def resolve_local_dir(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                      allow_patterns: list[str] | None = None) -> Path:
    """A local model directory for ``path`` (a directory, or a Hub id looked up in the HF cache only;
    ``allow_patterns``: only those files of the snapshot must be there, e.g. one MAGI-1 variant).

    Raises MissingWeightsError naming what is missing and where it was looked for.
    """
    from huggingface_hub import constants, snapshot_download

    local = Path(path).expanduser()
    if local.is_dir():
        return local
    text = str(path)
    if local.is_absolute() or text.startswith((".", "~")) or text.count("/") != 1:
        raise MissingWeightsError(f"model path={text!r}: no such local directory; {FETCH_HINT}")
    cache = Path(cache_dir).expanduser() if cache_dir is not None else Path(constants.HF_HUB_CACHE)
    try:
        return Path(snapshot_download(repo_id=text, cache_dir=str(cache), local_files_only=True,
                                      allow_patterns=allow_patterns))
    except Exception as err:  # LocalEntryNotFoundError and friends: nothing usable in the cache
        files = f" for {allow_patterns}" if allow_patterns else ""
        raise MissingWeightsError(
            f"model path={text!r} is neither a local directory nor in the Hugging Face cache "
            f"(looked in {cache}{files}; set model.cache_dir or HF_HUB_CACHE to change it); {FETCH_HINT}") from err


def require_subfolder(directory: Path, subfolder: str, what: str) -> Path:
    sub = directory / subfolder
    if not sub.is_dir():
        raise MissingWeightsError(f"{what} not found: expected the folder {sub}; {FETCH_HINT}")
    return sub


def load_original_wan_checkpoint(file: str | os.PathLike, key: str | None = None) -> dict[str, torch.Tensor]:
    """State dict of an original-format Wan / Self-Forcing checkpoint (.pt or .safetensors) in diffusers names.

    key: the entry holding the weights in a .pt dict (Self-Forcing: "generator_ema" or "generator").
    Prefixes added by training wrappers ("model.", FSDP, torch.compile) are stripped.
    """
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    file = Path(file).expanduser()
    if not file.is_file():
        raise MissingWeightsError(f"transformer_checkpoint={str(file)!r} does not exist; {FETCH_HINT}")
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(file))
    else:
        state = torch.load(file, map_location="cpu", weights_only=True)
    if key is not None:
        if key not in state:
            raise ValueError(f"checkpoint_key={key!r} is not in {file}: it has {sorted(state)[:10]}")
        state = state[key]
    check_finite_weights(state, file, FETCH_HINT)
    cleaned = {}
    for name, tensor in state.items():
        changed = True
        while changed:
            changed = False
            for prefix in CHECKPOINT_PREFIXES:
                if name.startswith(prefix):
                    name, changed = name[len(prefix):], True
        cleaned[name] = tensor
    return convert_wan_transformer_to_diffusers(cleaned)


def cast_like_diffusers(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast parameters to ``dtype`` except the model's ``_keep_in_fp32_modules`` (as diffusers' loader does).

    Non-persistent buffers (RoPE tables) keep their dtype.
    """
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, param in model.named_parameters():
        target = torch.float32 if keep & set(name.split(".")) else dtype
        if param.is_floating_point():
            param.data = param.data.to(target)
    return model


def load_sharded_safetensors(path: Path, what: str) -> dict[str, torch.Tensor]:
    """A ``.safetensors`` file, or a ``.safetensors.index.json`` and every shard it lists (each must exist and
    hold the keys the index maps to it), every tensor finite. ``what`` names the model in the errors."""
    from safetensors.torch import load_file

    if not path.name.endswith(".index.json"):
        if not path.is_file():
            raise MissingWeightsError(f"{what} weights not found: expected {path}; {FETCH_HINT}")
        state = load_file(str(path))
        check_finite_weights(state, path, FETCH_HINT)
        return state
    shards: dict[str, list[str]] = {}  # shard file -> the keys the index maps to it
    for name, shard in json.loads(path.read_text())["weight_map"].items():
        shards.setdefault(shard, []).append(name)
    state = {}
    for shard, names in sorted(shards.items()):
        file = path.parent / shard
        if not file.is_file():
            raise MissingWeightsError(f"{what} shard {shard} (listed in {path}) not found: expected {file}; "
                                      f"{FETCH_HINT}")
        tensors = load_file(str(file))
        check_finite_weights(tensors, file, FETCH_HINT)
        missing = [n for n in names if n not in tensors]
        if missing:
            raise ValueError(f"{file} lacks {len(missing)} keys its index {path.name} lists, e.g. {missing[:3]}")
        state.update({n: tensors[n] for n in names})
    return state


def _folder_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise MissingWeightsError(f"no *.safetensors weights in {folder}; {FETCH_HINT}")
    state: dict[str, torch.Tensor] = {}
    for file in files:  # one file or the shards of a sharded checkpoint
        shard = load_file(str(file))
        check_finite_weights(shard, file, FETCH_HINT)
        state.update(shard)
    return state


def load_wan_transformer(local_dir: Path, class_name: str, dtype: torch.dtype, subfolder: str = "transformer",
                         checkpoint: str | None = None, checkpoint_key: str | None = None) -> torch.nn.Module:
    """The transformer from a diffusers folder; with ``checkpoint``, config from there and weights from the file.

    Built from its config and loaded with a strict state dict rather than ``from_pretrained``, which in
    diffusers 0.42 needs ``accelerate`` for these models (their fp32-kept modules force low-memory loading).
    """
    if class_name not in TRANSFORMER_CLASS_NAMES:
        raise ValueError(f"class={class_name!r} is not allowed: use one of {TRANSFORMER_CLASS_NAMES}")
    cls = transformer_classes()[class_name]
    folder = require_subfolder(local_dir, subfolder, f"{class_name} config/weights")
    if not (folder / "config.json").is_file():
        raise MissingWeightsError(f"{class_name} config not found: expected {folder / 'config.json'}; {FETCH_HINT}")
    model = cls.from_config(cls.load_config(str(folder)))
    state = (_folder_state_dict(folder) if checkpoint is None
             else load_original_wan_checkpoint(checkpoint, checkpoint_key))
    model.load_state_dict(state, strict=True)
    return cast_like_diffusers(model, dtype)


class T5PromptEncoder:
    """Wan's text conditioning: UMT5 states, zeroed past the prompt, padded to ``max_sequence_length``."""

    def __init__(self, tokenizer: Any, text_encoder: torch.nn.Module, max_sequence_length: int = 512):
        self.tokenizer = tokenizer
        self.text_encoder = text_encoder.eval()
        self.max_sequence_length = max_sequence_length

    @torch.no_grad()
    def __call__(self, prompts: list[str]) -> torch.Tensor:
        tok = self.tokenizer(prompts, padding="max_length", max_length=self.max_sequence_length, truncation=True,
                             add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
        device = next(self.text_encoder.parameters()).device
        mask = tok.attention_mask.to(device)  # (B, L)
        states = self.text_encoder(tok.input_ids.to(device), mask).last_hidden_state  # (B, L, text_dim)
        return states * mask[..., None].to(states.dtype)


class WanVaeDecoder:
    """(1, C, F, H, W) normalized Wan latents -> (F', 3, H', W') video in [0, 1] through AutoencoderKLWan."""

    def __init__(self, vae: torch.nn.Module):
        self.vae = vae.eval()

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        param = next(self.vae.parameters())
        mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1)
        z = (latents.float().cpu() * std + mean).to(param.device, param.dtype)  # (1, C, F, H, W)
        video = self.vae.decode(z, return_dict=False)[0]  # (1, 3, F', H', W') in [-1, 1]
        return ((video[0].float().permute(1, 0, 2, 3) + 1) / 2).clamp(0, 1)
