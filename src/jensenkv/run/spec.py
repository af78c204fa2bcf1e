"""A run's specification: the composed Hydra config validated and canonicalised into a RunSpec.

Validation is cheap on purpose (config files only, no weights, no model code): bad input fails in seconds
with one ValueError naming the key, the value and what is allowed. Canonicalisation resets what a method
ignores (QVG settings for RTN, every quantizer field for bf16, the correction of a bf16 run), so equal
runs get equal ids.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs"
CONFIG_GROUPS = ("model", "quant", "correction", "eval", "logger", "experiment")
CORRECTIONS = ("none", "taylor", "exact")
VALUES_MODES = ("same", "none")
METRICS = ("psnr", "ssim", "lpips", "vbench", "attention", "content")
FULL_PRECISION_DTYPES = ("bfloat16", "float16", "float32")


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"{key}={value!r} is not allowed: {allowed}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- the run's specification ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def weights_digest(model: Mapping[str, Any]) -> str | None:
    """Digest of the built-in model's weights file, so retrained weights never reuse old runs.

    Real checkpoints (GBs) are identified by their path / hub id in the model config instead.
    """
    if model.get("kind") != "tiny":
        return None
    from jensenkv.models.tiny.config import WEIGHTS_DIR, WEIGHTS_FILE

    path = Path(model.get("weights_dir") or WEIGHTS_DIR) / WEIGHTS_FILE
    if not path.is_file():
        return None  # loading reports the missing file, naming it
    stat = path.stat()
    return _file_digest(str(path), stat.st_size, stat.st_mtime_ns)

@dataclass(frozen=True)
class RunSpec:
    """Everything one run does, validated and canonicalised (built from the Hydra config, no heavy work)."""

    model: dict                  # plain model config (configs/model/*.yaml)
    key: Any                     # QuantConfig of the key cache
    value: Any                   # QuantConfig of the value cache
    values_mode: str             # "same" | "none"
    correction: str              # "none" | "taylor" | "exact"
    strength: float
    sink_chunks: int
    window_chunks: int | None
    full_precision_dtype: str    # dtype of everything the cache keeps unquantized (bf16 rows, sinks)
    prompts: tuple[str, ...]
    seeds: tuple[int, ...]
    metrics: tuple[str, ...]
    lpips_net: str
    vbench_dimensions: tuple[str, ...]
    vbench_device: str | None
    fps: int
    save_videos: bool
    results_dir: Path
    experiment_name: str
    threads: int | None
    logger: dict

    @property
    def model_name(self) -> str:
        return str(self.model.get("name") or self.model.get("kind") or "model")

    @property
    def is_reference(self) -> bool:
        """A full-precision run: its videos are the references themselves."""
        return self.key.method == "none" and self.value.method == "none"

    def identity(self) -> dict:
        """What the run id hashes: everything that changes the run's videos or metrics."""
        return {
            "model": self.model,
            "weights": weights_digest(self.model),
            "key": dataclasses.asdict(self.key),
            "value": dataclasses.asdict(self.value),
            "correction": self.correction,
            "strength": self.strength,
            "sink_chunks": self.sink_chunks,
            "window_chunks": self.window_chunks,
            "prompts": list(self.prompts),
            "seeds": list(self.seeds),
            "metrics": sorted(self.metrics),
            "lpips_net": self.lpips_net if "lpips" in self.metrics else None,
            "vbench_dimensions": sorted(self.vbench_dimensions) if "vbench" in self.metrics else None,
            "fps": self.fps,
        }

    @property
    def run_id(self) -> str:
        from jensenkv.tracking import config_hash

        return config_hash(self.identity())

    def reference_identity(self, prompt: str, seed: int) -> dict:
        """What a BF16 reference video depends on: the model, the prompt, the seed and the cache layout."""
        return {"kind": "full-precision reference", "model": self.model, "weights": weights_digest(self.model),
                "prompt": prompt, "seed": int(seed),
                "sink_chunks": self.sink_chunks, "window_chunks": self.window_chunks,
                "full_precision_dtype": self.full_precision_dtype}

    def labels(self) -> dict:
        """Columns of the results table that describe the run."""
        quantized = self.key.method != "none"
        return {
            "model": self.model_name,
            "quantizer": self.key.label,
            "method": self.key.method,
            "bits": int(self.key.bits) if quantized else 16,
            "group_size": int(self.key.group_size) if quantized else None,
            "granularity": self.key.granularity if quantized else None,
            "rotation": self.key.rotation if quantized else "none",
            "values": self.values_mode,
            "correction": self.correction,
            "strength": self.strength,
            "sink_chunks": self.sink_chunks,
            "window_chunks": self.window_chunks,
        }

    def cache_config(self, keep_reference: bool):
        from jensenkv.cache import CacheConfig

        return CacheConfig(key=self.key, value=self.value, sink_chunks=self.sink_chunks,
                           window_chunks=self.window_chunks, keep_reference=keep_reference)

    def reference_cache_config(self):
        from jensenkv.cache import CacheConfig
        from jensenkv.quant import QuantConfig

        full = QuantConfig(method="none", store_dtype=self.full_precision_dtype)
        return CacheConfig(key=full, value=full, sink_chunks=self.sink_chunks, window_chunks=self.window_chunks)


def _plain(node: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def canonical_quant_configs(quant: Mapping[str, Any], full_precision_dtype: str,
                            head_dim: int | None) -> tuple[Any, Any, str]:
    """(key QuantConfig, value QuantConfig, values mode) with the settings each method ignores reset.

    Raises ValueError naming the quant.* key for any bad value.
    """
    from jensenkv.quant import QuantConfig

    quant = dict(quant)
    values_mode = quant.pop("values", "same")
    if values_mode not in VALUES_MODES:
        _fail("quant.values", values_mode, f"use one of {VALUES_MODES}")
    quant["store_dtype"] = full_precision_dtype
    defaults = QuantConfig(store_dtype=full_precision_dtype)
    if quant.get("method") == "none":  # nothing quantized: every other setting is irrelevant (and unchecked)
        key = defaults = QuantConfig(method="none", store_dtype=full_precision_dtype)
        values_mode = "none"
    else:
        key = QuantConfig.from_dict(quant)
        key.validate(head_dim)
        if key.method != "qvg":
            key = dataclasses.replace(key, **{f.name: getattr(defaults, f.name) for f in dataclasses.fields(key)
                                              if f.name.startswith("qvg_")})
        if key.rotation == "none":
            key = dataclasses.replace(key, rotation_seed=defaults.rotation_seed)
    if values_mode == "none":
        value = QuantConfig(method="none", store_dtype=full_precision_dtype)
    elif key.granularity == "channel":  # KIVI: per-channel keys, per-token values
        value = dataclasses.replace(key, granularity="token_group")
        try:
            value.validate(head_dim)
        except ValueError as e:
            raise ValueError(f"{e} (granularity=channel keys: values are quantized per token in groups of "
                             "group_size channels, as KIVI does; or set quant.values=none)") from None
    else:
        value = key
    return key, value, values_mode


def _tiny_weights_dir() -> Path:
    """The packaged tiny weights folder, located without importing the model code (which pulls diffusers)."""
    import importlib.util

    spec = importlib.util.find_spec("jensenkv.models.tiny")
    return Path(next(iter(spec.submodule_search_locations))) / "weights"


def _diffusers_local_dir(model: Mapping[str, Any]) -> Path:
    """A diffusers model folder: a local directory, or a Hub id already in the HF cache (never downloads)."""
    local = Path(str(model["path"])).expanduser()
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id=str(model["path"]), cache_dir=model.get("cache_dir"), local_files_only=True))


def model_geometry(model: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(head_dim, tokens per chunk) read from config files only (no weights, no model code);
    (None, None) when unknown (the adapter then reports missing weights itself, with the fix)."""
    try:
        if model.get("kind") == "tiny":
            weights_dir = Path(model.get("weights_dir") or _tiny_weights_dir())
            stored = json.loads((weights_dir / "config.json").read_text())
            transformer = stored["transformer"]
            height, width = stored["data"]["height"], stored["data"]["width"]
            frames = model.get("frames_per_chunk") or stored["sampler"]["frames_per_chunk"]
            scale = 1  # pixel space
        elif model.get("kind") == "diffusers":
            local = _diffusers_local_dir(model)
            sub = model.get("transformer_subfolder") or "transformer"
            transformer = json.loads((local / sub / "config.json").read_text())
            height, width, frames, scale = model["height"], model["width"], model.get("frames_per_chunk"), 8
        else:
            return None, None
        head_dim = int(transformer["attention_head_dim"])
        _, p_h, p_w = transformer["patch_size"]
    except Exception:  # noqa: BLE001 - unreadable or absent: not this check's error to report
        return None, None
    tokens = None if frames is None else int(frames) * (int(height) // scale // p_h) * (int(width) // scale // p_w)
    return head_dim, tokens


def check_generation_settings(model: Mapping[str, Any]) -> None:
    """The sampler keys a model config sets explicitly (null keys take the model's stored defaults)."""
    from jensenkv.generate import GenerationConfig

    names = {f.name for f in dataclasses.fields(GenerationConfig)}
    values = {k: v for k, v in model.items() if k in names and v is not None}
    if isinstance(values.get("kv_range"), list):
        values["kv_range"] = tuple(values["kv_range"])
    try:
        GenerationConfig(**values).validate()
    except ValueError as e:
        raise ValueError(f"model.{e}") from None


def build_spec(cfg: Any) -> RunSpec:
    """Validate the composed config and turn it into a RunSpec. Raises ValueError naming the bad key."""
    from jensenkv.eval.fidelity import LPIPS_BACKBONE_FILES
    from jensenkv.eval.vbench import validate_dimensions
    from jensenkv.tracking import resolve_wandb_mode

    cfg = _plain(cfg)
    model = dict(cfg["model"])
    if model.get("device") in (None, "auto"):  # the id must say where the run happened
        import torch

        model["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    cache = cfg.get("cache") or {}
    full_dtype = cache.get("full_precision_dtype", "bfloat16")
    if full_dtype not in FULL_PRECISION_DTYPES:
        _fail("cache.full_precision_dtype", full_dtype, f"use one of {FULL_PRECISION_DTYPES}")
    check_generation_settings(model)
    head_dim, tokens_per_chunk = model_geometry(model)
    key, value, values_mode = canonical_quant_configs(cfg["quant"], full_dtype, head_dim)
    if key.method == "qvg" and tokens_per_chunk is not None and key.qvg_centroids > tokens_per_chunk:
        _fail("quant.qvg_centroids", key.qvg_centroids,
              f"must be <= the {tokens_per_chunk} tokens of one chunk of model {model.get('name')!r}")
    if key.granularity == "channel" and key.method != "none" and tokens_per_chunk is not None \
            and key.group_size > tokens_per_chunk:
        _fail("quant.group_size", key.group_size,
              f"with granularity=channel it counts tokens and must be <= the {tokens_per_chunk} tokens of a chunk")

    correction = cfg.get("correction") or {}
    method = correction.get("method", "none")
    if method not in CORRECTIONS:
        _fail("correction.method", method, f"use one of {CORRECTIONS}")
    strength = correction.get("strength", 1.0)
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not strength >= 0:
        _fail("correction.strength", strength, "must be a number >= 0")
    if key.method == "none":  # no quantized keys: nothing to correct
        method, strength = "none", 1.0

    sink = cache.get("sink_chunks", 0)
    if not _is_int(sink) or sink < 0:
        _fail("cache.sink_chunks", sink, "must be an integer >= 0")
    window = cache.get("window_chunks")
    if window is not None and (not _is_int(window) or window < 1):
        _fail("cache.window_chunks", window, "must be null (all chunks) or an integer >= 1")

    ev = cfg["eval"]
    prompts = ev.get("prompts")
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        _fail("eval.prompts", prompts, "must be a non-empty list of non-empty strings")
    num = ev.get("num_prompts")
    if num is not None and (not _is_int(num) or not 1 <= num <= len(prompts)):
        _fail("eval.num_prompts", num, f"must be null (all) or an integer in [1, {len(prompts)}]")
    seeds = ev.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(_is_int(s) and s >= 0 for s in seeds):
        _fail("eval.seeds", seeds, "must be a non-empty list of integers >= 0")
    metrics = ev.get("metrics", [])
    if not isinstance(metrics, list) or any(m not in METRICS for m in metrics):
        _fail("eval.metrics", metrics, f"must be a list drawn from {METRICS}")
    lpips_net = (ev.get("lpips") or {}).get("net", "alex")
    if lpips_net not in LPIPS_BACKBONE_FILES:
        _fail("eval.lpips.net", lpips_net, f"use one of {tuple(LPIPS_BACKBONE_FILES)}")
    vb = ev.get("vbench") or {}
    dims = vb.get("dimensions", [])
    validate_dimensions(dims)
    fps = ev.get("fps", 8)
    if not _is_int(fps) or fps < 1:
        _fail("eval.fps", fps, "must be an integer >= 1")
    threads = cfg.get("threads")
    if threads is not None and (not _is_int(threads) or threads < 1):
        _fail("threads", threads, "must be null or an integer >= 1")
    logger = dict(cfg.get("logger") or {})
    resolve_wandb_mode(logger.get("mode", "offline"))

    return RunSpec(
        model=model, key=key, value=value, values_mode=values_mode, correction=method, strength=float(strength),
        sink_chunks=sink, window_chunks=window, full_precision_dtype=full_dtype,
        prompts=tuple(prompts[:num] if num else prompts), seeds=tuple(seeds), metrics=tuple(dict.fromkeys(metrics)),
        lpips_net=lpips_net, vbench_dimensions=tuple(dict.fromkeys(dims)), vbench_device=vb.get("device"),
        fps=fps, save_videos=bool(ev.get("save_videos", True)),
        results_dir=Path(cfg["paths"]["results_dir"]), experiment_name=str(cfg.get("experiment_name") or "default"),
        threads=threads, logger=logger,
    )
