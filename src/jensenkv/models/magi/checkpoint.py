"""Load MAGI-1's official checkpoint files (never downloads).

Where the files are (the Hub repo ``sand-ai/MAGI-1`` as is, or a local copy of it):

    <root>/ckpt/magi/<variant>/inference_weight[.distill]/model.safetensors[.index.json]
        variant: 4.5B_base | 4.5B_distill | 24B_base | 24B_distill  (".distill" for the distilled ones)
    <root>/ckpt/t5/t5-v1_1-xxl/          T5 tokenizer + encoder (transformers format)
    <root>/ckpt/vae/                     config.json (ddconfig) + diffusion_pytorch_model.safetensors
    example/assets/special_tokens.npz    of SandAI-org/MAGI-1 (the code repo), for the HQ / duration tokens

``root`` is a local directory or a Hub id resolved in the Hugging Face cache with ``local_files_only``.

Key mapping (official -> this port): identity. ``MagiDiT`` uses the official ``VideoDiTModel`` module
names, so every official key loads under its own name (``OFFICIAL_KEY_TEMPLATES`` lists them; ``{i}`` is
the layer). Training-wrapper prefixes (``module.``, ``model.``, ``_orig_mod.``) are stripped. Layouts the
forward must respect (and does): ``linear_kv_xattn.weight`` rows are per KV head [k (head_dim), v
(head_dim)]; ``linear_proj`` reads [self, cross] interleaved in ``proj_interleave_blocks`` blocks; LayerNorm1p
gains are stored as w - 1. The fp8 checkpoints (``inference_weight.fp8*``) are refused.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from jensenkv.models.magi.config import MagiModelConfig
from jensenkv.models.magi.model import MagiDiT
from jensenkv.models.loaders import FETCH_HINT, MissingWeightsError, load_sharded_safetensors, resolve_local_dir

HUB_REPO = "sand-ai/MAGI-1"
VARIANTS = {"4.5B_base": "inference_weight", "4.5B_distill": "inference_weight.distill",
            "24B_base": "inference_weight", "24B_distill": "inference_weight.distill"}
WRAPPER_PREFIXES = ("module.", "model.", "_orig_mod.")
_LAYER = "videodit_blocks.layers.{i}."
OFFICIAL_KEY_TEMPLATES = (
    "x_embedder.weight",
    "t_embedder.mlp.0.weight", "t_embedder.mlp.0.bias", "t_embedder.mlp.2.weight", "t_embedder.mlp.2.bias",
    "y_embedder.y_proj_xattn.0.weight", "y_embedder.y_proj_xattn.0.bias",
    "y_embedder.y_proj_adaln.0.weight", "y_embedder.y_proj_adaln.0.bias", "y_embedder.null_caption_embedding",
    "rope.bands",
    _LAYER + "ada_modulate_layer.proj.0.weight", _LAYER + "ada_modulate_layer.proj.0.bias",
    _LAYER + "self_attention.linear_qkv.layer_norm.weight", _LAYER + "self_attention.linear_qkv.layer_norm.bias",
    _LAYER + "self_attention.linear_qkv.q.weight", _LAYER + "self_attention.linear_qkv.qx.weight",
    _LAYER + "self_attention.linear_qkv.k.weight", _LAYER + "self_attention.linear_qkv.v.weight",
    _LAYER + "self_attention.linear_kv_xattn.weight", _LAYER + "self_attention.linear_proj.weight",
    *(_LAYER + f"self_attention.{norm}.{p}" for norm in ("q_layernorm", "q_layernorm_xattn", "k_layernorm",
                                                          "k_layernorm_xattn") for p in ("weight", "bias")),
    _LAYER + "self_attn_post_norm.weight", _LAYER + "self_attn_post_norm.bias",
    _LAYER + "mlp.layer_norm.weight", _LAYER + "mlp.layer_norm.bias",
    _LAYER + "mlp.linear_fc1.weight", _LAYER + "mlp.linear_fc2.weight",
    _LAYER + "mlp_post_norm.weight", _LAYER + "mlp_post_norm.bias",
    "videodit_blocks.final_layernorm.weight", "videodit_blocks.final_layernorm.bias",
    "final_linear.linear.weight",
)


def official_keys(num_layers: int) -> list[str]:
    """Every key of an official MAGI-1 DiT state dict with ``num_layers`` layers."""
    keys = []
    for template in OFFICIAL_KEY_TEMPLATES:
        keys.extend(template.format(i=i) for i in range(num_layers)) if "{i}" in template else keys.append(template)
    return keys


def from_official(name: str) -> str:
    """Official key -> this port's parameter name (identity after stripping wrapper prefixes)."""
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
    return name


def resolve_root(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                 patterns: list[str] | None = None) -> Path:
    """A local directory for ``path``: itself if it is a directory, else the Hub id's snapshot in the HF cache
    (only ``patterns`` of it need be there)."""
    return resolve_local_dir(path, cache_dir, patterns or ["*"])


def weights_dir(root: Path, variant: str) -> Path:
    """The folder holding the DiT weights: ``root`` itself if it has them, else ckpt/magi/<variant>/<subdir>."""
    if variant not in VARIANTS:
        raise ValueError(f"magi variant={variant!r} is not allowed: use one of {tuple(VARIANTS)}")
    if (root / "model.safetensors").is_file() or (root / "model.safetensors.index.json").is_file():
        return root
    folder = root / "ckpt" / "magi" / variant / VARIANTS[variant]
    if not folder.is_dir():
        raise MissingWeightsError(f"MAGI-1 {variant} weights not found: expected the folder {folder} with "
                                  f"model.safetensors[.index.json]; {FETCH_HINT}")
    return folder


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """model.safetensors.index.json (sharded) or model.safetensors in ``folder``, keys in this port's names."""
    index, file = folder / "model.safetensors.index.json", folder / "model.safetensors"
    if not index.is_file() and not file.is_file():
        raise MissingWeightsError(f"MAGI-1 weights not found: expected {index} or {file}; {FETCH_HINT}")
    state = load_sharded_safetensors(index if index.is_file() else file, "MAGI-1")
    fp8 = [n for n in state if n.endswith(("weight_scale", "input_scale", "smooth_scale"))]
    if fp8:
        raise ValueError(f"{folder} holds an fp8-quantized checkpoint (e.g. {fp8[0]}): it is not allowed here; "
                         "use the bf16 inference_weight[.distill] files")
    return {from_official(k): v for k, v in state.items()}


def load_dit(cfg: MagiModelConfig, folder: Path, dtype: torch.dtype = torch.bfloat16,
             device: str | torch.device = "cpu") -> MagiDiT:
    """The DiT of ``cfg`` with the weights in ``folder``; every model key must be present and no other."""
    with torch.device("meta"):
        model = MagiDiT(cfg)
    state = load_state_dict(folder)
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"MAGI-1 weights in {folder} do not fit the config: {len(missing)} missing keys "
                         f"(e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]}); check "
                         "the preset (4.5B / 24B) and the variant")
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device).to_dtype(dtype)


def save_official(model: MagiDiT, folder: Path, shards: int = 1) -> Path:
    """Write ``model`` as official files (model.safetensors, or ``shards`` files + index.json) in ``folder``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if shards <= 1:
        save_file(state, str(folder / "model.safetensors"))
        return folder
    names = sorted(state)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: state[n] for n in part}, str(folder / file))
        weight_map.update({n: file for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder
