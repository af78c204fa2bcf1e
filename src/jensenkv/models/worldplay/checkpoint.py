"""Load the official HY-WorldPlay transformer checkpoints strictly (never downloads).

Where the files are (the Hub repo ``tencent/HY-WorldPlay`` as is, or a local copy of it), one folder per
variant, each a full transformer state dict (HunyuanVideo-1.5 480p I2V + WorldPlay's action parameters):

    <root>/ar_distilled_action_model/model.safetensors          (the distilled AR model; WorldPlay's download
                                        script copies it to diffusion_pytorch_model.safetensors: either is read)
    <root>/ar_model/diffusion_pytorch_model.safetensors
    <root>/ar_rl_model/diffusion_pytorch_model.safetensors
    any of them may be sharded: <name>.safetensors.index.json + the shards it lists

``load_transformer(folder, config, precision, device)`` reads a variant folder (or a file / index),
``weights_file(root, variant)`` names the file a run will read (``MissingWeightsError`` listing every path
looked in when none is there).

WorldPlay builds the model from ``tencent/HunyuanVideo-1.5/transformer/480p_i2v``, calls
``add_action_parameters()`` and loads these files with ``strict=True`` (pipeline l.2075-2087); this loader
does the same: every key below must be present, and no other.

Key table (official name = this port's parameter name; ``{i}``: block 0..53, ``{r}``: refiner block 0..1;
``.w/.b``: ``.weight`` and ``.bias``):

| official key | module | shape (8B) |
|---|---|---|
| ``img_in.proj.w/.b`` | Conv3d 65 -> 2048, kernel (1,1,1) | (2048, 65, 1, 1, 1) |
| ``time_in.mlp.{0,2}.w/.b`` | timestep sinusoid(256) -> MLP | (2048, 256), (2048, 2048) |
| ``action_in.mlp.{0,2}.w/.b`` | WorldPlay: action sinusoid(256) -> MLP, added to time_in | as time_in |
| ``txt_in.input_embedder.w/.b`` | Qwen 3584 -> 2048 | (2048, 3584) |
| ``txt_in.t_embedder.mlp.{0,2}.w/.b`` | refiner's timestep MLP (t = 0) | as time_in |
| ``txt_in.c_embedder.linear_{1,2}.w/.b`` | pooled prompt MLP | (2048, 3584), (2048, 2048) |
| ``txt_in.individual_token_refiner.blocks.{r}.{norm1,norm2}.w/.b`` | affine LayerNorms | (2048,) |
| ``txt_in.individual_token_refiner.blocks.{r}.self_attn_qkv.w/.b`` | fused qkv | (6144, 2048) |
| ``txt_in.individual_token_refiner.blocks.{r}.self_attn_proj.w/.b`` | | (2048, 2048) |
| ``txt_in.individual_token_refiner.blocks.{r}.mlp.fc{1,2}.w/.b`` | SiLU MLP x4 | (8192, 2048), (2048, 8192) |
| ``txt_in.individual_token_refiner.blocks.{r}.adaLN_modulation.1.w/.b`` | gates | (4096, 2048) |
| ``byt5_in.layernorm.w/.b``, ``byt5_in.fc{1,2,3}.w/.b`` | ByT5 1472 -> 2048 -> 2048 -> 2048 | |
| ``vision_in.proj.{0,4}.w/.b`` (LayerNorms), ``vision_in.proj.{1,3}.w/.b`` | SigLIP 1152 -> 1152 -> 2048 | |
| ``cond_type_embedding.weight`` | rows: 0 Qwen, 1 ByT5, 2 SigLIP | (3, 2048) |
| ``double_blocks.{i}.{img,txt}_mod.linear.w/.b`` | adaLN, 6 vectors | (12288, 2048) |
| ``double_blocks.{i}.{img,txt}_attn_{q,k,v}.w/.b`` | | (2048, 2048) |
| ``double_blocks.{i}.{img,txt}_attn_{q,k}_norm.weight`` | RMSNorm over the head dim | (128,) |
| ``double_blocks.{i}.{img,txt}_attn_proj.w/.b`` | | (2048, 2048) |
| ``double_blocks.{i}.img_attn_prope_proj.w/.b`` | WorldPlay: ProPE branch output | (2048, 2048) |
| ``double_blocks.{i}.{img,txt}_mlp.fc{1,2}.w/.b`` | GELU(tanh) MLP x4 | (8192, 2048), (2048, 8192) |
| ``final_layer.linear.w/.b`` | | (32, 2048) |
| ``final_layer.adaLN_modulation.1.w/.b`` | (shift, scale) in that order | (4096, 2048) |

The norms without parameters (``img_norm1/2``, ``txt_norm1/2``, ``final_layer.norm_final``) have no keys.
Diffusers' converted copies (``FastVideo/HY-WorldPlay-*-Diffusers``, diffusers names) are not read here.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from jensenkv.models.loaders import FETCH_HINT, MissingWeightsError, load_sharded_safetensors, resolve_local_dir
from jensenkv.models.worldplay.config import WorldPlayPrecision, WorldPlayTransformerConfig
from jensenkv.models.worldplay.model import WorldPlayTransformer

HUB_REPO = "tencent/HY-WorldPlay"
# variant folder -> weight files looked for, in order (each may be sharded: <file>.index.json)
VARIANTS: dict[str, tuple[str, ...]] = {
    "ar_distilled_action_model": ("model.safetensors", "diffusion_pytorch_model.safetensors"),
    "ar_model": ("diffusion_pytorch_model.safetensors",),
    "ar_rl_model": ("diffusion_pytorch_model.safetensors",),
}
_WB = (".weight", ".bias")
_BLOCK = "double_blocks.{i}."
_REFINER = "txt_in.individual_token_refiner.blocks.{r}."
BASE_KEY_TEMPLATES: tuple[str, ...] = (
    *("img_in.proj" + s for s in _WB),
    *(f"time_in.mlp.{j}{s}" for j in (0, 2) for s in _WB),
    *("txt_in.input_embedder" + s for s in _WB),
    *(f"txt_in.t_embedder.mlp.{j}{s}" for j in (0, 2) for s in _WB),
    *(f"txt_in.c_embedder.linear_{j}{s}" for j in (1, 2) for s in _WB),
    *(_REFINER + f"{m}{s}" for m in ("norm1", "norm2", "self_attn_qkv", "self_attn_proj", "mlp.fc1", "mlp.fc2",
                                     "adaLN_modulation.1") for s in _WB),
    *(f"byt5_in.{m}{s}" for m in ("layernorm", "fc1", "fc2", "fc3") for s in _WB),
    *(f"vision_in.proj.{j}{s}" for j in (0, 1, 3, 4) for s in _WB),
    "cond_type_embedding.weight",
    *(_BLOCK + f"{st}_{m}{s}" for st in ("img", "txt") for m in ("mod.linear", "attn_q", "attn_k", "attn_v",
                                                                  "attn_proj", "mlp.fc1", "mlp.fc2") for s in _WB),
    *(_BLOCK + f"{st}_attn_{n}_norm.weight" for st in ("img", "txt") for n in ("q", "k")),
    *(f"final_layer.{m}{s}" for m in ("linear", "adaLN_modulation.1") for s in _WB),
)
# what WorldPlay's add_action_parameters() adds to the base model
ACTION_KEY_TEMPLATES: tuple[str, ...] = (
    *(f"action_in.mlp.{j}{s}" for j in (0, 2) for s in _WB),
    *(_BLOCK + "img_attn_prope_proj" + s for s in _WB),
)


def _expand(templates: tuple[str, ...], cfg: WorldPlayTransformerConfig) -> list[str]:
    keys = []
    for t in templates:
        if "{i}" in t:
            keys.extend(t.format(i=i) for i in range(cfg.num_layers))
        elif "{r}" in t:
            keys.extend(t.format(r=r) for r in range(cfg.refiner_depth))
        else:
            keys.append(t)
    return keys


def official_keys(cfg: WorldPlayTransformerConfig) -> list[str]:
    """Every key of an official WorldPlay action checkpoint of this shape (base + action parameters)."""
    return _expand(BASE_KEY_TEMPLATES, cfg) + _expand(ACTION_KEY_TEMPLATES, cfg)


def action_keys(cfg: WorldPlayTransformerConfig) -> list[str]:
    return _expand(ACTION_KEY_TEMPLATES, cfg)


def resolve_root(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local directory for ``path``: itself if it is a directory, else the Hub id's snapshot in the HF cache."""
    return resolve_local_dir(path, cache_dir, ["*"])


# every file name a variant folder may hold its weights in, in the order they are looked for
WEIGHT_FILES = ("model.safetensors", "diffusion_pytorch_model.safetensors")


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"worldplay variant={variant!r} is not allowed: use one of {tuple(VARIANTS)}")


def candidate_files(root: Path, variant: str) -> list[Path]:
    """Every path looked in for ``variant``'s weights under ``root``, in order (each file, then its index)."""
    _check_variant(variant)
    folder = root / variant
    return [p for name in VARIANTS[variant] for p in (folder / name, folder / f"{name}.index.json")]


def find_weights(folder: Path, names: tuple[str, ...] = WEIGHT_FILES) -> Path:
    """The first existing weight file (or sharded index) in a checkpoint folder; MissingWeightsError naming
    every path looked in otherwise."""
    candidates = [p for name in names for p in (folder / name, folder / f"{name}.index.json")]
    for path in candidates:
        if path.is_file():
            return path
    raise MissingWeightsError(f"HY-WorldPlay transformer weights not found: looked for "
                              f"{', '.join(str(p) for p in candidates)}; {FETCH_HINT}")


def weights_file(root: Path, variant: str) -> Path:
    """The weight file (or index) of ``variant`` under ``root`` (the Hub repo's layout)."""
    _check_variant(variant)
    return find_weights(root / variant, VARIANTS[variant])


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A ``.safetensors`` file, or a ``.safetensors.index.json`` and its shards (each must exist)."""
    return load_sharded_safetensors(path, "HY-WorldPlay")


def check_keys(state: dict[str, torch.Tensor], cfg: WorldPlayTransformerConfig, source: Path | str) -> None:
    """Refuse a state dict that is not exactly an action checkpoint of this shape, naming the first bad key."""
    expected = official_keys(cfg)
    missing = [k for k in expected if k not in state]
    action = [k for k in missing if k in set(action_keys(cfg))]
    if action:
        raise ValueError(f"{source} lacks {action[0]} ({len(action)} WorldPlay action/ProPE keys missing): not a "
                         "WorldPlay action checkpoint (the base HunyuanVideo-1.5 transformer?); use "
                         f"{'/'.join(VARIANTS)}")
    if missing:
        raise ValueError(f"{source} lacks {missing[0]} ({len(missing)} keys missing): check the config "
                         f"(num_layers={cfg.num_layers}, refiner_depth={cfg.refiner_depth})")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise ValueError(f"{source} has unexpected key {unexpected[0]} ({len(unexpected)} in all): not the "
                         "WorldPlay 480p I2V transformer of this config")


def load_transformer(path: str | os.PathLike, cfg: WorldPlayTransformerConfig,
                     precision: WorldPlayPrecision | None = None, device: str | torch.device = "cpu") -> WorldPlayTransformer:
    """The transformer with the weights at ``path``, strictly: a variant folder (e.g. <root>/ar_model: its
    weight file is found with ``find_weights``), a ``.safetensors`` file or a sharded ``.index.json``."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = find_weights(path)
    state = load_state_dict(path)
    check_keys(state, cfg, path)
    with torch.device("meta"):
        model = WorldPlayTransformer(cfg, precision)
    own = model.state_dict()
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise ValueError(f"{path}: {name} has shape {tuple(tensor.shape)}, the config expects "
                             f"{tuple(own[name].shape)}")
    # own, aligned storage: tensors viewing the file's buffer can take other (last-bit different) GEMM paths
    model.load_state_dict({k: v.clone(memory_format=torch.contiguous_format) for k, v in state.items()},
                          strict=True, assign=True)
    return model.to(device).to_precision().eval()


def save_official(model: WorldPlayTransformer, folder: Path, filename: str = "diffusion_pytorch_model.safetensors",
                  shards: int = 1) -> Path:
    """Write ``model`` as an official file (or ``shards`` files + ``<filename>.index.json``); returns what
    ``weights_file`` would find."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if shards <= 1:
        save_file(state, str(folder / filename))
        return folder / filename
    stem = filename.removesuffix(".safetensors")
    names = sorted(state)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        file = f"{stem}-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: state[n] for n in part}, str(folder / file))
        weight_map.update({n: file for n in part})
    index = folder / f"{filename}.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index
