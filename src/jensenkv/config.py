"""The typed config tree: one dataclass per concern, the single source of truth for every setting.

    RunConfig
      model: ModelConfig            which network, where its weights are, device and dtype
      generation: GenerationConfig  how a video is sampled chunk by chunk (staircase, kv ranges, CFG)
      quant: QuantConfig            the key quantizer preset (jensenkv.quant.QuantConfig)
      cache: CacheSettings          values same|none, sink chunks, window, full-precision dtype
      attention: AttentionConfig    backend, correction, strength, probe layers
      eval: EvalConfig              prompts, seeds, metrics, LPIPS, VBench
      logger: LoggerConfig          W&B
      paths: PathsConfig, threads, experiment_name

Hydra composes ``configs/`` on top of these schemas (``register_configs`` puts ``RunConfig`` in Hydra's
ConfigStore as ``run_schema``, which ``configs/config.yaml`` lists first), so every field exists with its
default, is type-checked and can be overridden from the command line (``generation.kv_range=[4,3,2,1]``,
``attention.backend=reference``). ``OmegaConf.to_object`` then builds the dataclasses, and each node
validates itself in ``__post_init__``: a ValueError naming the key, the value and what is allowed.
A preset file (``configs/quant/rtn.yaml``) only states how it differs from these defaults.

The run's identity (what its id hashes) is ``RunConfig.identity``. Settings a method ignores are reset
when the tree is built (QVG fields of an RTN run, every quantizer field of a BF16 run, the correction of a
run with nothing quantized), so equal runs get equal ids.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from jensenkv.correction import CORRECTIONS
from jensenkv.quant.config import FLOAT_DTYPES, QuantConfig

SAMPLERS = ("euler", "x0_renoise")
MODEL_KINDS = ("tiny", "diffusers", "magi")
T_SCHEDULES = ("sd3", "square", "identity")  # MAGI-1 time schedules
MODEL_DTYPES = tuple(FLOAT_DTYPES)
VALUES_MODES = ("same", "none")
METRICS = ("psnr", "ssim", "lpips", "vbench", "attention", "content")
# Model fields each kind reads; a kind refuses a value for a field it does not read.
KIND_FIELDS = {
    "tiny": ("weights_dir",),
    "diffusers": ("transformer_class", "path", "cache_dir", "height", "width", "max_sequence_length",
                  "transformer_subfolder", "transformer_checkpoint", "checkpoint_key", "fps", "vae_dtype"),
    "magi": ("preset", "variant", "path", "cache_dir", "height", "width", "fps", "vae_dtype", "t5_path", "vae_path",
             "vae_latent_scale", "special_tokens_file", "special_tokens", "model_overrides", "latent_height",
             "latent_width", "seed"),
}


def fail(key: str, value: Any, allowed: str) -> None:
    raise ValueError(f"{key}={value!r} is not allowed: {allowed}")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(key: str, value: Any, low: int, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not is_int(value) or value < low:
        fail(key, value, f"must be {'null or ' if optional else ''}an integer >= {low}")


def check_choice(key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        fail(key, value, f"use one of {allowed}")


def check_finite(key: str, value: Any, low: float, *, strict: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value > low if strict else value >= low)
    if not ok:
        fail(key, value, f"must be a finite number {'>' if strict else '>='} {low}")


def check_kv_range(value: Any, key: str = "generation.kv_range") -> None:
    """A kv-range is null (no limit) or an integer >= 0 (number of visible cached chunks)."""
    check_int(key, value, 0, optional=True)


def check_cache_layout(sink_chunks: Any, window_chunks: Any) -> None:
    """Sinks: an integer >= 0. Window: null (every non-sink chunk visible) or an integer >= 0 (0: sinks only)."""
    check_int("cache.sink_chunks", sink_chunks, 0)
    check_int("cache.window_chunks", window_chunks, 0, optional=True)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass
class ModelConfig:
    """Which network runs and where its weights are (configs/model/*.yaml).

    kind "tiny": the built-in model (weights_dir: its folder; null: the packaged weights).
    kind "diffusers": a SkyReels-V2 / Wan checkpoint in diffusers layout at ``path`` (a local folder or a Hub
    id already in the Hugging Face cache; never downloaded at run time); ``transformer_checkpoint``
    optionally replaces the transformer weights with an original-format Wan state dict.
    kind "magi": MAGI-1 (jensenkv.models.magi, docs/MAGI1.md): ``preset`` tiny (seeded random, no weights) or
    4.5B / 4.5B_distill / 24B / 24B_distill, loaded from the official files of sand-ai/MAGI-1 at ``path``.
    """

    kind: str = "tiny"
    name: str = "tiny"
    device: str = "auto"               # auto (cuda if available, else cpu) | cpu | cuda | cuda:<n>
    dtype: str = "float32"             # transformer and text encoder
    weights_dir: Optional[str] = None
    transformer_class: Optional[str] = None  # SkyReelsV2Transformer3DModel | WanTransformer3DModel
    path: Optional[str] = None
    cache_dir: Optional[str] = None
    height: Optional[int] = None
    width: Optional[int] = None
    max_sequence_length: Optional[int] = None
    transformer_subfolder: Optional[str] = None
    transformer_checkpoint: Optional[str] = None
    checkpoint_key: Optional[str] = None
    fps: Optional[int] = None          # only read by checkpoints with inject_sample_info
    vae_dtype: Optional[str] = None
    preset: Optional[str] = None       # magi: tiny | 4.5B | 4.5B_distill | 24B | 24B_distill
    variant: Optional[str] = None      # magi: checkpoint folder under ckpt/magi/ (null: the preset's)
    t5_path: Optional[str] = None      # magi: T5 folder (null: <path>/ckpt/t5/t5-v1_1-xxl)
    vae_path: Optional[str] = None     # magi: ViT VAE folder (null: <path>/ckpt/vae)
    vae_latent_scale: Optional[float] = None
    special_tokens_file: Optional[str] = None
    special_tokens: Optional[list[str]] = None
    model_overrides: Optional[dict[str, Any]] = None  # magi: MagiModelConfig fields replaced in the preset
    latent_height: Optional[int] = None  # magi tiny: latent frame size (real presets: height / 8)
    latent_width: Optional[int] = None
    seed: Optional[int] = None         # magi tiny: seed of the random initialisation

    def __post_init__(self) -> None:
        check_choice("model.kind", self.kind, MODEL_KINDS)
        if not isinstance(self.name, str) or not self.name:
            fail("model.name", self.name, "must be a non-empty string")
        check_choice("model.dtype", self.dtype, MODEL_DTYPES)
        if self.vae_dtype is not None:
            check_choice("model.vae_dtype", self.vae_dtype, MODEL_DTYPES)
        self.device = resolve_device(self.device)
        for key in sorted({f for fields in KIND_FIELDS.values() for f in fields} - set(KIND_FIELDS[self.kind])):
            if getattr(self, key) is not None:
                fail(f"model.{key}", getattr(self, key), f"kind={self.kind} does not read it; leave it null")
        if self.kind == "magi" and self.preset is None:
            fail("model.preset", None, "kind=magi needs a preset: tiny, 4.5B, 4.5B_distill, 24B or 24B_distill")
        if self.kind == "diffusers":
            for key in ("transformer_class", "path", "height", "width"):
                if getattr(self, key) is None:
                    fail(f"model.{key}", None, "kind=diffusers needs transformer_class, path, height and width")
            for key in ("height", "width"):
                check_int(f"model.{key}", getattr(self, key), 8)
        check_int("model.max_sequence_length", self.max_sequence_length, 1, optional=True)
        check_int("model.fps", self.fps, 1, optional=True)
        for key in ("latent_height", "latent_width"):
            check_int(f"model.{key}", getattr(self, key), 1, optional=True)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def resolve_device(device: Any) -> str:
    """"auto" -> "cuda" when a GPU is visible, else "cpu"; "cuda[:n]" needs a visible GPU."""
    import re

    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        fail("model.device", device, "use auto, cpu, cuda or cuda:<n>")
    if device.startswith("cuda") and not cuda_available():
        fail("model.device", device, "no CUDA device is visible on this machine; use auto or cpu")
    return device


@dataclass
class MagiScheduleConfig:
    """MAGI-1 sampling beyond the generator's staircase (``generation.magi``; official runtime/engine names).

    cfg_number: 3 = cond (text + cache), prefix (null caption + cache, the only pass that writes the cache)
        and uncond (null caption, each chunk alone); 1 = one pass that writes the cache (distilled models).
    cfg_t_range / prev_chunk_scales / text_scales: piecewise guidance scales by each chunk's MAGI time
        (0 = noise, 1 = clean): v = (1 - p) u + (p - s) prefix + s cond.
    clean_t: the time at which a finished chunk is re-run (null caption) to write its K/V to the cache.
    t_schedule: "sd3" (linspace^2 then the SD3 shift, MAGI's default) | "square" | "identity".
    distill_nearly_clean_chunk_threshold / distill_prev_chunks_scale: distilled models re-run the oldest
        in-flight chunk alone once its time exceeds the threshold and mix the outputs
        scale * (with context) + (1 - scale) * (alone); None disables it.
    """

    cfg_number: int = 3
    cfg_t_range: list[float] = field(default_factory=lambda: [0.0, 0.0217, 0.1, 0.3, 0.999])
    prev_chunk_scales: list[float] = field(default_factory=lambda: [1.5, 1.5, 1.5, 1.0, 1.0])
    text_scales: list[float] = field(default_factory=lambda: [7.5, 7.5, 7.5, 0.0, 0.0])
    clean_t: float = 0.9999
    t_schedule: str = "sd3"
    distill_nearly_clean_chunk_threshold: Optional[float] = 0.3
    distill_prev_chunks_scale: float = 0.7
    null_caption_tokens: int = 50       # valid tokens of the null caption in cross-attention
    distill_dt: Optional[float] = None  # distilled models' shortcut step input; None: steps / 4 * 2 (official)

    def __post_init__(self) -> None:
        for key in ("cfg_t_range", "prev_chunk_scales", "text_scales"):
            setattr(self, key, [float(x) for x in getattr(self, key)])
        check_choice("generation.magi.cfg_number", self.cfg_number, (1, 3))
        n = len(self.cfg_t_range)
        if n < 1 or len(self.prev_chunk_scales) != n or len(self.text_scales) != n:
            fail("generation.magi.cfg_t_range / prev_chunk_scales / text_scales",
                 (n, len(self.prev_chunk_scales), len(self.text_scales)), "they need the same length >= 1")
        if self.cfg_t_range != sorted(self.cfg_t_range):
            fail("generation.magi.cfg_t_range", self.cfg_t_range, "it must be ascending")
        if not (isinstance(self.clean_t, (int, float)) and 0.0 <= self.clean_t <= 1.0):
            fail("generation.magi.clean_t", self.clean_t, "it must be in [0, 1]")
        check_choice("generation.magi.t_schedule", self.t_schedule, T_SCHEDULES)
        check_int("generation.magi.null_caption_tokens", self.null_caption_tokens, 1)

    def validate(self) -> None:
        self.__post_init__()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MagiScheduleConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            fail("generation.magi", unknown, f"unknown keys; allowed: {sorted(known)}")
        return cls(**dict(values))

    def guidance_scales(self, t: float) -> tuple[float, float]:
        """(prev_chunk_scale, text_scale) of a chunk at MAGI time t (the official searchsorted rule)."""
        import torch

        ranges = torch.tensor(self.cfg_t_range, dtype=torch.float32) - 1e-7
        index = int(torch.searchsorted(ranges, torch.tensor([t], dtype=torch.float32)).item()) - 1
        if not 0 <= index < len(self.prev_chunk_scales):
            raise ValueError(f"chunk time t={t} falls outside generation.magi.cfg_t_range={self.cfg_t_range}")
        return self.prev_chunk_scales[index], self.text_scales[index]


@dataclass
class GenerationConfig:
    """How one video is sampled chunk by chunk (model presets in configs/model/ set their own).

    kv_range: optional per-denoising-stage limit on the number of preceding chunks a chunk may attend to:
        the most recent ones, earlier in-flight chunks first (window_size > 1), then the ones the cache shows;
        ``None`` entries mean no limit. The steps are split into ``len(kv_range)`` equal stages, e.g.
        MAGI-1's noise2clean_kvrange=[5, 4, 3, 2] (which counts the chunk itself) is ``kv_range=[4, 3, 2, 1]``.
        A limit larger than the chunks that exist shows all of them.
    commit_kv_range: the same limit (cached chunks) for the clean commit pass.
    window_size: chunks denoised concurrently in MAGI-1's pipelined staircase (1: one chunk at a time).
        It must divide ``steps``; chunk i is ``steps // window_size`` steps ahead of chunk i + 1.
    sampler: "euler" (x <- x + (t_next - t) v) or "x0_renoise" (predict x0, re-noise to t_next with
        fresh noise; the few-step consistency / DMD sampler of Self-Forcing).
    guidance_scale: classifier-free guidance; 1.0 disables it (and the "uncond" caches).
    """

    num_chunks: int = 4
    frames_per_chunk: int = 2
    steps: int = 10
    shift: float = 2.0
    guidance_scale: float = 1.0
    sampler: str = "euler"
    kv_range: Optional[list[Optional[int]]] = None
    commit_kv_range: Optional[int] = None
    negative_prompt: str = ""
    window_size: int = 1
    magi: Optional[MagiScheduleConfig] = None  # MAGI-1's refresh pass, 3-way / distilled guidance, time schedule

    def __post_init__(self) -> None:
        if isinstance(self.magi, dict):
            self.magi = MagiScheduleConfig.from_dict(self.magi)
        for key in ("num_chunks", "frames_per_chunk", "steps", "window_size"):
            check_int(f"generation.{key}", getattr(self, key), 1)
        if self.steps % self.window_size:
            fail("generation.window_size", self.window_size, f"it must divide generation.steps={self.steps} "
                 "(each in-flight chunk is steps // window_size steps ahead of the next)")
        check_finite("generation.shift", self.shift, 0, strict=True)
        check_finite("generation.guidance_scale", self.guidance_scale, 0)
        check_choice("generation.sampler", self.sampler, SAMPLERS)
        if self.kv_range is not None:
            if isinstance(self.kv_range, (str, bytes)) or not 1 <= len(self.kv_range) <= self.steps:
                fail("generation.kv_range", self.kv_range,
                     f"use null or a list of 1..steps={self.steps} entries (one per denoising stage)")
            self.kv_range = list(self.kv_range)
            for r in self.kv_range:
                check_kv_range(r)
        check_kv_range(self.commit_kv_range, "generation.commit_kv_range")
        if not isinstance(self.negative_prompt, str):
            fail("generation.negative_prompt", self.negative_prompt, "must be a string")

    def validate(self) -> None:
        """Re-check after a field was changed in place (construction already checks)."""
        self.__post_init__()

    @property
    def use_cfg(self) -> bool:
        return self.guidance_scale != 1.0

    def kv_range_at(self, step: int) -> int | None:
        """The kv-range of denoising step ``step`` (0-based): stage = step * stages // steps."""
        if self.kv_range is None:
            return None
        return self.kv_range[step * len(self.kv_range) // self.steps]


@dataclass
class CacheSettings:
    """How a layer's cache stores the chunks (the quantizer itself is ``RunConfig.quant``).

    values: "same" quantizes values like keys (KIVI "channel" keys: values per token, in groups of
        group_size channels, as KIVI does); "none" keeps values full precision (isolates the key error).
    full_precision_dtype: what everything unquantized is stored in: the BF16 reference cache, sink chunks,
        values=none. "BF16" everywhere in the suite means this cache.
    """

    values: str = "same"
    sink_chunks: int = 0               # first n chunks stay full precision and always visible
    window_chunks: Optional[int] = None  # only the last n non-sink chunks are visible (null: all; 0: sinks only)
    full_precision_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        check_choice("cache.values", self.values, VALUES_MODES)
        check_cache_layout(self.sink_chunks, self.window_chunks)
        check_choice("cache.full_precision_dtype", self.full_precision_dtype, MODEL_DTYPES)

    def full_precision(self) -> QuantConfig:
        """The quantizer of everything kept unquantized: the BF16 reference's keys and values."""
        return QuantConfig(method="none", store_dtype=self.full_precision_dtype)

    def key_value(self, quant: QuantConfig, head_dim: int | None = None) -> tuple[QuantConfig, QuantConfig]:
        """(key, value) QuantConfigs with the settings each method ignores reset (so equal runs hash equal)."""
        if quant.method == "none":
            full = self.full_precision()
            return full, full
        defaults = QuantConfig()
        reset = {"store_dtype": self.full_precision_dtype}
        if quant.method != "qvg":
            reset.update({f.name: getattr(defaults, f.name) for f in dataclasses.fields(quant)
                          if f.name.startswith("qvg_")})
        if quant.rotation == "none":
            reset["rotation_seed"] = defaults.rotation_seed
        if quant.dither == "none":
            reset["dither_seed"] = defaults.dither_seed
        key = dataclasses.replace(quant, **reset)
        key.validate(head_dim)
        if self.values == "none":
            return key, self.full_precision()
        if key.granularity != "channel":
            return key, key
        value = dataclasses.replace(key, granularity="token_group")  # KIVI: per-token values
        try:
            value.validate(head_dim)
        except ValueError as e:
            raise ValueError(f"{e} (granularity=channel keys: values are quantized per token in groups of "
                             "group_size channels, as KIVI does; or set cache.values=none)") from None
        return key, value


@dataclass
class AttentionConfig:
    """How the cached self-attention is computed.

    backend: a kernel of jensenkv.attention.ATTENTION_BACKENDS: "cached" (fast CPU path), "reference" (the
        readable oracle), "flex" (GPU FlexAttention), or one registered there.
    correction: Jensen-bias correction of the cached scores; strength scales it (1.0: the paper's; any finite
        value, signed: a negative strength adds the bias).
    second_order: subtract b (1 - pi) instead of b (pi: the key's softmax weight in its row), which corrects
        log Z to second order where b over-corrects peaky attention (jensenkv.attention.second_order). Needs
        correction taylor or exact; backends flex and triton refuse it (cached and reference implement it).
    calibration: null, or the path of a calibration file of signed per-(layer, head) strengths
        (``python -m jensenkv.calibrate``, jensenkv.calibration): the effective strength of layer l, head h is
        strength x file[l][h]. A run refuses a file fitted for another model, quantizer or correction, with
        other layer/head counts, or on prompts it evaluates; the file's digest is part of the run's id.
    probe_layers / probe_steps: the layers and denoising steps whose attention probes are recorded when
        eval.metrics has "attention" (null: all). Real models' presets set evenly spaced subsets
        (jensenkv.attention.probes.evenly_spaced): every layer x step x chunk x branch is ~7,200 calls per video.
    diagnostics: each probe also records theta, Var(e)/(D^2/12), the first-order / Jensen split of the cached
        partition's shift and n_eff (keys em_*): why the correction helps or over-corrects, per layer and step.
    head_moments: each probe also records per-head sums of the realized cached log-partition shift and of the
        correction's softmax-weighted bias (keys hm_*, lists of H; jensenkv.attention.diagnostics.head_shift_moments):
        what ``python -m jensenkv.calibrate`` fits per-(layer, head) strengths from.
    probes: whether probes are recorded; a run derives it from eval.metrics, Python callers set it.
    """

    backend: str = "cached"
    correction: str = "none"
    strength: float = 1.0
    second_order: bool = False  # the b (1 - pi) correction (configs/correction/taylor2.yaml)
    calibration: Optional[str] = None  # path of a per-(layer, head) strength file (jensenkv.calibrate)
    probe_layers: Optional[list[int]] = None
    probe_steps: Optional[list[int]] = None
    diagnostics: bool = False  # add the error-model diagnostics (jensenkv.attention.diagnostics) to each probe
    head_moments: bool = False  # add per-head shift / bias sums to each probe (what jensenkv.calibrate fits)
    probes: bool = False

    def __post_init__(self) -> None:
        from jensenkv.attention.backends import ATTENTION_BACKENDS  # the kernels (a dict: name -> function)

        check_choice("attention.backend", self.backend, tuple(ATTENTION_BACKENDS))
        check_choice("attention.correction", self.correction, CORRECTIONS)
        if isinstance(self.strength, bool) or not isinstance(self.strength, (int, float)) \
                or not math.isfinite(self.strength):
            fail("attention.strength", self.strength, "must be a finite number (signed: a global multiplier)")
        if self.calibration is not None and (not isinstance(self.calibration, str) or not self.calibration.strip()):
            fail("attention.calibration", self.calibration, "must be null or the path of a calibration file")
        self._check_second_order()
        for key in ("probe_layers", "probe_steps"):
            value = getattr(self, key)
            if value is None:
                continue
            if isinstance(value, (str, bytes)) or not all(is_int(i) and i >= 0 for i in value):
                fail(f"attention.{key}", value, "use null (all) or a list of integer indices >= 0")
            setattr(self, key, sorted(set(value)))
        for key in ("probes", "diagnostics", "head_moments"):
            if not isinstance(getattr(self, key), bool):
                fail(f"attention.{key}", getattr(self, key), "must be true or false")

    def validate(self) -> None:
        self.__post_init__()

    def _check_second_order(self) -> None:
        from jensenkv.attention.second_order import SECOND_ORDER_BACKENDS, SECOND_ORDER_REFUSED, check_second_order

        check_second_order(self.second_order, self.correction)
        if self.second_order and self.backend in SECOND_ORDER_REFUSED:
            fail("attention.second_order", self.second_order,
                 f"with backend={self.backend!r}: true needs a backend in {SECOND_ORDER_BACKENDS}")

    def probes_at(self, layer: int, step: int | None) -> bool:
        """Whether a probe is recorded for this layer and denoising step."""
        return self.probes and (self.probe_layers is None or layer in self.probe_layers) and \
            (self.probe_steps is None or step in self.probe_steps)


@dataclass
class LpipsConfig:
    net: str = "alex"  # alex (the LPIPS default) | vgg | squeeze; needs the torchvision backbone file

    def __post_init__(self) -> None:
        from jensenkv.eval.fidelity import LPIPS_BACKBONE_FILES  # the nets whose backbone file is known

        check_choice("eval.lpips.net", self.net, tuple(LPIPS_BACKBONE_FILES))


@dataclass
class VBenchConfig:
    dimensions: list[str] = field(default_factory=lambda: [
        "subject_consistency", "background_consistency", "imaging_quality", "aesthetic_quality",
        "temporal_flickering"])
    device: Optional[str] = None  # null: the run's device

    def __post_init__(self) -> None:
        from jensenkv.eval.vbench import validate_dimensions

        validate_dimensions(self.dimensions)
        self.dimensions = list(dict.fromkeys(self.dimensions))


@dataclass
class EvalConfig:
    """What a run generates and how it is scored (configs/eval/*.yaml)."""

    prompts: list[str] = field(default_factory=list)
    num_prompts: Optional[int] = None  # use the first n prompts (null: all)
    seeds: list[int] = field(default_factory=lambda: [0])
    metrics: list[str] = field(default_factory=lambda: list(METRICS))
    lpips: LpipsConfig = field(default_factory=LpipsConfig)
    vbench: VBenchConfig = field(default_factory=VBenchConfig)
    fps: int = 8                       # frame rate of the saved mp4 files
    save_videos: bool = True           # keep each quantized video as mp4 next to the run record
    # true: a requested metric or dimension whose weights or packages are absent stops the run before any
    # video is generated (jensenkv.doctor.require_ready); false: it is recorded missing, with the reason
    require_ready: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.prompts, str) or not self.prompts \
                or not all(isinstance(p, str) and p.strip() for p in self.prompts):
            fail("eval.prompts", self.prompts, "must be a non-empty list of non-empty strings")
        check_int("eval.num_prompts", self.num_prompts, 1, optional=True)
        if self.num_prompts is not None and self.num_prompts > len(self.prompts):
            fail("eval.num_prompts", self.num_prompts, f"must be null (all) or an integer in [1, {len(self.prompts)}]")
        if isinstance(self.seeds, str) or not self.seeds or not all(is_int(s) and s >= 0 for s in self.seeds):
            fail("eval.seeds", self.seeds, "must be a non-empty list of integers >= 0")
        if isinstance(self.metrics, str) or any(m not in METRICS for m in self.metrics):
            fail("eval.metrics", self.metrics, f"must be a list drawn from {METRICS}")
        self.metrics = list(dict.fromkeys(self.metrics))
        check_int("eval.fps", self.fps, 1)
        for key in ("save_videos", "require_ready"):
            if not isinstance(getattr(self, key), bool):
                fail(f"eval.{key}", getattr(self, key), "must be true or false")

    @property
    def used_prompts(self) -> list[str]:
        return list(self.prompts[:self.num_prompts] if self.num_prompts else self.prompts)


@dataclass
class LoggerConfig:
    """W&B. WANDB_MODE in the environment wins over ``mode`` (tests set WANDB_MODE=disabled)."""

    mode: str = "offline"
    project: str = "jensenkv"
    entity: Optional[str] = None
    dir: str = "${paths.results_dir}/wandb"
    tags: list[str] = field(default_factory=list)
    log_video: bool = True             # one sample video per run
    log_plots: bool = True             # attention-mass plot per run

    def __post_init__(self) -> None:
        from jensenkv.tracking import resolve_wandb_mode

        resolve_wandb_mode(self.mode)


@dataclass
class PathsConfig:
    results_dir: str = "${oc.env:JENSENKV_RESULTS,results}"  # runs/, refs/, wandb/ live here


@dataclass
class RunConfig:
    """One run: a (model, generation, quantizer, cache, attention, eval) point. Validated on construction."""

    model: ModelConfig = field(default_factory=ModelConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    cache: CacheSettings = field(default_factory=CacheSettings)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(prompts=["a red square moving right on a dark "
                                                                         "background"]))
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    threads: Optional[int] = None      # torch threads; null: 1 for the built-in model, else the cores shared out
                                       # between parallel local jobs, at most 4 (run.runner.default_threads);
                                       # OMP_NUM_THREADS, when set, wins
    experiment_name: str = "default"   # bookkeeping only (W&B group); not part of the run id

    def __post_init__(self) -> None:
        from jensenkv.run.spec import model_geometry

        check_int("threads", self.threads, 1, optional=True)
        if (self.model.kind == "magi") != (self.generation.magi is not None):
            fail("generation.magi", self.generation.magi,
                 "MAGI-1 models need it (configs/model/magi1_*.yaml set it) and other models must leave it null")
        head_dim, tokens_per_chunk = model_geometry(self.model, self.generation)
        self.key, self.value = self.cache.key_value(self.quant, head_dim)
        if self.key.method == "qvg" and tokens_per_chunk is not None and self.key.qvg_centroids > tokens_per_chunk:
            fail("quant.qvg_centroids", self.key.qvg_centroids,
                 f"must be <= the {tokens_per_chunk} tokens of one chunk of model {self.model.name!r}")
        if self.key.granularity == "channel" and self.key.method != "none" and tokens_per_chunk is not None \
                and self.key.group_size > tokens_per_chunk:
            fail("quant.group_size", self.key.group_size,
                 f"with granularity=channel it counts tokens and must be <= the {tokens_per_chunk} tokens of a chunk")
        if self.is_reference:  # nothing quantized: nothing to correct
            self.attention = dataclasses.replace(self.attention, correction="none", strength=1.0, second_order=False)
        if self.attention.correction == "none":  # no bias to scale: the file changes nothing
            self.attention = dataclasses.replace(self.attention, calibration=None)
        self.attention = dataclasses.replace(self.attention, probes="attention" in self.eval.metrics)
        if self.attention.calibration is not None:  # refused here, before any model is loaded
            from jensenkv.calibration import check_calibration

            check_calibration(self)

    # --- derived views -----------------------------------------------------------------------------------
    @property
    def is_reference(self) -> bool:
        """A full-precision run: its videos are the references themselves."""
        return self.key.method == "none" and self.value.method == "none"

    @property
    def values_mode(self) -> str:
        return "none" if self.value.method == "none" else "same"

    @property
    def prompts(self) -> list[str]:
        return self.eval.used_prompts

    @property
    def results_dir(self) -> Path:
        return Path(self.paths.results_dir)


    def cache_config(self, keep_reference: bool):
        """The quantized cache of this run (jensenkv.cache.CacheConfig)."""
        from jensenkv.cache import CacheConfig

        return CacheConfig(key=self.key, value=self.value, sink_chunks=self.cache.sink_chunks,
                           window_chunks=self.cache.window_chunks, keep_reference=keep_reference)

    def reference_cache_config(self):
        """The BF16 reference cache: same layout, nothing quantized, stored in cache.full_precision_dtype."""
        from jensenkv.cache import CacheConfig

        full = self.cache.full_precision()
        return CacheConfig(key=full, value=full, sink_chunks=self.cache.sink_chunks,
                           window_chunks=self.cache.window_chunks)

    # --- identity ----------------------------------------------------------------------------------------
    def identity(self) -> dict:
        """What the run id hashes: everything that changes the run's videos or metrics."""
        from jensenkv.run.spec import weights_digest

        metrics = sorted(self.eval.metrics)
        return {
            "model": self.model.to_dict(),
            "weights": weights_digest(self.model),
            "generation": dataclasses.asdict(self.generation),
            "key": dataclasses.asdict(self.key),
            "value": dataclasses.asdict(self.value),
            "sink_chunks": self.cache.sink_chunks,
            "window_chunks": self.cache.window_chunks,
            "full_precision_dtype": self.cache.full_precision_dtype,
            "backend": self.attention.backend,
            "correction": self.attention.correction,
            "strength": self.attention.strength,
            "second_order": self.attention.second_order,
            "calibration": self.calibration_digest,
            "probe_layers": self.attention.probe_layers if self.attention.probes else None,
            "probe_steps": self.attention.probe_steps if self.attention.probes else None,
            "diagnostics": self.attention.diagnostics and self.attention.probes,
            "head_moments": self.attention.head_moments and self.attention.probes,
            "prompts": self.prompts,
            "seeds": list(self.eval.seeds),
            "metrics": metrics,
            "lpips_net": self.eval.lpips.net if "lpips" in metrics else None,
            "vbench_dimensions": sorted(self.eval.vbench.dimensions) if "vbench" in metrics else None,
            "fps": self.eval.fps,
        }

    @property
    def run_id(self) -> str:
        from jensenkv.tracking import config_hash

        return config_hash(self.identity())

    def reference_identity(self, prompt: str, seed: int) -> dict:
        """What a BF16 reference video depends on: model, generation, prompt, seed and the cache layout."""
        from jensenkv.run.spec import weights_digest

        return {"kind": "full-precision reference", "model": self.model.to_dict(),
                "weights": weights_digest(self.model), "generation": dataclasses.asdict(self.generation),
                "prompt": prompt, "seed": int(seed),
                "sink_chunks": self.cache.sink_chunks, "window_chunks": self.cache.window_chunks,
                "full_precision_dtype": self.cache.full_precision_dtype, "backend": self.attention.backend}

    @property
    def calibration_digest(self) -> str | None:
        """Content digest of the run's calibration file (None without one): two calibrations are two runs."""
        from jensenkv.calibration import digest

        return digest(self.attention.calibration)

    def labels(self) -> dict:
        """Columns of the results table that describe the run."""
        from jensenkv.calibration import strength_label

        quantized = self.key.method != "none"
        return {
            "model": self.model.name,
            "quantizer": self.key.label,
            "method": self.key.method,
            "bits": int(self.key.bits) if quantized else 16,
            "group_size": int(self.key.group_size) if quantized else None,
            "granularity": self.key.granularity if quantized else None,
            "rotation": self.key.rotation if quantized else "none",
            "values": self.values_mode,
            "correction": self.attention.correction,
            "strength": strength_label(self.attention.strength, self.attention.calibration),
            "second_order": self.attention.second_order,
            "calibration": self.calibration_digest,
            "sink_chunks": self.cache.sink_chunks,
            "window_chunks": self.cache.window_chunks,
        }


def register_configs() -> None:
    """Put the tree's schema in Hydra's ConfigStore (``configs/config.yaml`` lists ``run_schema`` first)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="run_schema", node=RunConfig)
