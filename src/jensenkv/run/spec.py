"""A run's specification: the composed Hydra config built into the typed tree (jensenkv.config.RunConfig).

Building is cheap on purpose (config files only, no weights, no model code): bad input fails in seconds
with one ValueError naming the key, the value and what is allowed. ``RunSpec`` is the tree's root.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from jensenkv.config import GenerationConfig, ModelConfig, RunConfig, register_configs

CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs"
CONFIG_GROUPS = ("model", "quant", "correction", "eval", "logger", "experiment")
RunSpec = RunConfig  # the validated, canonical description of one run

register_configs()


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"{key}={value!r} is not allowed: {allowed}")


@functools.lru_cache(maxsize=8)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def tiny_weights_dir(model: ModelConfig) -> Path:
    """The built-in model's weights folder: model.weights_dir, or the packaged one (found without importing
    the model code, which pulls diffusers)."""
    if model.weights_dir:
        return Path(model.weights_dir).expanduser()
    import importlib.util

    spec = importlib.util.find_spec("jensenkv.models.tiny")
    return Path(next(iter(spec.submodule_search_locations))) / "weights"


def weights_digest(model: ModelConfig) -> str | None:
    """Digest of the built-in model's weights file, so retrained weights never reuse old runs.

    Real checkpoints (GBs) are identified by their path / hub id in the model config instead.
    """
    if model.kind != "tiny":
        return None
    path = tiny_weights_dir(model) / "model.safetensors"
    if not path.is_file():
        return None  # check_weights reports the missing file, naming it
    stat = path.stat()
    return _file_digest(str(path), stat.st_size, stat.st_mtime_ns)


def check_weights(model: ModelConfig) -> None:
    """Raise FileNotFoundError naming the missing file and where it is looked for (no model code loaded)."""
    if model.kind == "tiny":
        folder = tiny_weights_dir(model)
        for name in ("model.safetensors", "config.json"):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"model.weights_dir={str(folder)!r}: {name} is missing there "
                                        "(`make train-tiny` writes the built-in model's weights; null uses the packaged ones)")
    elif model.kind == "diffusers":
        folder = _diffusers_local_dir(model)
        if folder is None:
            raise FileNotFoundError(f"model.path={model.path!r} is neither a local folder nor in the Hugging Face "
                                    f"cache ({model.cache_dir or 'HF_HUB_CACHE'}); run `make fetch-weights` on a "
                                    "machine with internet, or point model.path at a local copy")
        sub = folder / (model.transformer_subfolder or "transformer") / "config.json"
        if not sub.is_file():
            raise FileNotFoundError(f"model.path={model.path!r}: {sub} is missing")
        if model.transformer_checkpoint and not Path(model.transformer_checkpoint).is_file():
            raise FileNotFoundError(f"model.transformer_checkpoint={model.transformer_checkpoint!r} does not exist "
                                    "(`make fetch-weights` downloads it)")
    elif model.kind == "magi" and model.preset != "tiny":  # the tiny preset is random-initialised: no files
        if _diffusers_local_dir(model) is None:
            raise FileNotFoundError(f"model.path={model.path!r} is neither a local folder nor in the Hugging Face "
                                    f"cache ({model.cache_dir or 'HF_HUB_CACHE'}); run `make fetch-weights` on a "
                                    "machine with internet (docs/MAGI1.md lists the files)")
        if model.special_tokens and not Path(str(model.special_tokens_file)).expanduser().is_file():
            raise FileNotFoundError(f"model.special_tokens_file={model.special_tokens_file!r} does not exist "
                                    "(`make fetch-weights` downloads special_tokens.npz)")


def _diffusers_local_dir(model: ModelConfig) -> Path | None:
    """A diffusers model folder: a local directory, or a Hub id already in the HF cache (never downloads)."""
    local = Path(str(model.path)).expanduser()
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=str(model.path), cache_dir=model.cache_dir, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or not a repo id): the caller names what is missing
        return None


def model_geometry(model: ModelConfig, generation: GenerationConfig) -> tuple[int | None, int | None]:
    """(head_dim, tokens per chunk) read from config files only (no weights, no model code);
    (None, None) when unknown (check_weights / the loader then report the missing file, with the fix)."""
    try:
        if model.kind == "tiny":
            stored = json.loads((tiny_weights_dir(model) / "config.json").read_text())
            transformer = stored["transformer"]
            height, width, scale = stored["data"]["height"], stored["data"]["width"], 1  # pixel space
        elif model.kind == "diffusers":
            local = _diffusers_local_dir(model)
            if local is None:
                return None, None
            sub = model.transformer_subfolder or "transformer"
            transformer = json.loads((local / sub / "config.json").read_text())
            height, width, scale = model.height, model.width, 8
        elif model.kind == "magi":
            from jensenkv.models.magi.config import model_preset

            magi = model_preset(model.preset, **(model.model_overrides or {}))
            patch = magi.patch_size
            if model.latent_height:  # tiny preset: latent size given directly
                height, width = model.latent_height, model.latent_width or model.latent_height
            else:
                height, width = model.height // 8, model.width // 8  # the ViT VAE: 8x spatial
            return magi.head_dim, generation.frames_per_chunk * (height // patch) * (width // patch)
        else:
            return None, None
        head_dim = int(transformer["attention_head_dim"])
        _, p_h, p_w = transformer["patch_size"]
    except (OSError, KeyError, ValueError, TypeError):  # unreadable or absent: check_weights reports it
        return None, None
    tokens = generation.frames_per_chunk * (int(height) // scale // p_h) * (int(width) // scale // p_w)
    return head_dim, tokens


def field_error_line(error: Exception) -> str:
    """An OmegaConf / Hydra validation error as one line: its first line plus the full key."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    full_key = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("full_key:")), None)
    head = lines[0] if lines else type(error).__name__
    return f"{full_key}: {head}" if full_key else head


def build_spec(cfg: Any) -> RunSpec:
    """The composed Hydra config as the typed tree; raises ValueError naming the bad key, FileNotFoundError
    naming a missing weights file."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(cfg, RunConfig):
        spec = cfg
    else:
        try:
            if not isinstance(cfg, DictConfig) or OmegaConf.get_type(cfg) is not RunConfig:
                # a plain mapping, or a config composed without the schema: merge it onto the schema
                plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
                plain.pop("hydra", None)
                cfg = OmegaConf.merge(OmegaConf.structured(RunConfig), plain)
            else:
                cfg = cfg.copy()
                with_hydra = "hydra" in cfg
                if with_hydra:
                    OmegaConf.set_struct(cfg, False)
                    cfg.pop("hydra")
            spec = OmegaConf.to_object(cfg)
        except OmegaConfBaseException as e:
            cause = e.__cause__ if isinstance(e.__cause__, (ValueError, FileNotFoundError)) else None
            if cause is not None:
                raise cause from None
            raise ValueError(field_error_line(e)) from None
    check_weights(spec.model)
    if spec.eval.require_ready:  # every requested metric must be computable before any video is made
        from jensenkv.doctor import require_ready

        require_ready(spec.eval.metrics, spec.eval.vbench.dimensions if "vbench" in spec.eval.metrics else (),
                      spec.eval.lpips.net)
    return spec
