"""The config tree of the LLM partial-prefill experiment (``python -m jensenkv.run.llm_prefill``), composed by Hydra from
``configs/llm/`` onto ``LlmPrefillConfig`` (its schema ``llm_schema``). Every field has its default here; each
node checks itself and fails in one line naming the key, the value and what is allowed.

    LlmPrefillConfig
      llm: LlmModelConfig     which causal LM (a preset of jensenkv.llm.weights, a Hub id in the cache, a folder)
      text: TextConfig        sources, windows per source, window length L, quantized prefix P
      quantizers              configs/quant presets, each one run (the Table 1 ones by default)
      treatments              corrections over the same stored prefix: none | taylor | exact | taylor2
      sink_quantizers         presets also run with the first token kept in full precision (an attention sink)
      hf_anchors              transformers' QuantizedCache backends run on the same windows (quanto, hqq)
      attention               backend, probed layers, which presets record the error-model diagnostics
      workers, paths, logger, experiment_name
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from jensenkv.attention.backends import causal_backends
from jensenkv.checks import check_choice, check_finite_tree, check_int, fail
from jensenkv.config.tree import PathsConfig
from jensenkv.hashing import config_hash
from jensenkv.store.llm import STORE_FOLDER
from jensenkv.llm.prefill import TREATMENTS
from jensenkv.llm.text import SOURCES
from jensenkv.quant import QuantConfig
from jensenkv.quant.config import FLOAT_DTYPES
from jensenkv.config.resolve import CONFIG_DIR
from jensenkv.config.logger import LoggerConfig, resolve_wandb_mode


@dataclass
class LlmModelConfig:
    name: str = "smollm2_135m"  # a preset (smollm2_135m, llama3_1_8b, mistral_7b_v0_3, qwen2_5_32b), Hub id or folder
    dtype: str = "float32"      # the model's weights and activations
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            fail("llm.name", self.name, "must be a preset, a Hub id in the local cache or a model folder")
        check_choice("llm.dtype", self.dtype, tuple(FLOAT_DTYPES))
        if self.device not in ("cpu", "cuda") and not str(self.device).startswith("cuda:"):
            fail("llm.device", self.device, "use cpu, cuda or cuda:<index>")


@dataclass
class TextConfig:
    sources: list[str] = field(default_factory=lambda: ["devil", "python_doc"])
    windows_per_source: int = 32  # windows of each source, dealt over its documents (jensenkv.llm.text)
    length: int = 640             # L: tokens per window
    prefix: int = 512             # P: the first P tokens are the quantized prefix; the rest are teacher-forced

    def __post_init__(self) -> None:
        if isinstance(self.sources, str) or not self.sources or len(set(self.sources)) != len(self.sources):
            fail("text.sources", self.sources, f"must be a list of distinct names from {tuple(SOURCES)}")
        for name in self.sources:
            check_choice("text.sources", name, tuple(SOURCES))
        check_int("text.windows_per_source", self.windows_per_source, 1)
        check_int("text.length", self.length, 3)
        check_int("text.prefix", self.prefix, 1)
        if self.prefix > self.length - 2:
            fail("text.prefix", self.prefix, f"must leave at least 2 continuation tokens: at most "
                                              f"text.length - 2 = {self.length - 2}")


@dataclass
class LlmAttentionConfig:
    backend: str = "cached"                     # a backend that takes causal calls: cached | reference
    probe_layers: Optional[list[int]] = None    # layers whose probes are recorded (null: all)
    # presets whose uncorrected probes add the error-model split (em_*) and the Taylor bias statistics: ~0.6 s per
    # window each, and what the comparison with the built-in model reads (its integer RTN row)
    diagnostic_quantizers: list[str] = field(default_factory=lambda: ["rtn"])

    def __post_init__(self) -> None:
        check_choice("attention.backend", self.backend, causal_backends())
        if self.probe_layers is not None and (isinstance(self.probe_layers, str) or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.probe_layers)):
            fail("attention.probe_layers", self.probe_layers, "use null (all) or a list of layer indices >= 0")
        if isinstance(self.diagnostic_quantizers, str):
            fail("attention.diagnostic_quantizers", self.diagnostic_quantizers, "must be a list of presets")


HF_BACKENDS = ("quanto", "hqq")  # transformers.QuantizedCache's group-wise integer backends
TABLE1_QUANTIZERS = ["rtn", "rtn_min_aligned", "rtn_dither", "quarot", "kivi", "qvg", "rtn_int4"]


@dataclass
class LlmPrefillConfig:
    llm: LlmModelConfig = field(default_factory=LlmModelConfig)
    text: TextConfig = field(default_factory=TextConfig)
    quantizers: list[str] = field(default_factory=lambda: list(TABLE1_QUANTIZERS))  # configs/quant presets
    treatments: list[str] = field(default_factory=lambda: ["none", "taylor", "exact", "taylor2"])
    sink_quantizers: list[str] = field(default_factory=lambda: ["rtn"])  # also run with a full-precision sink token
    # transformers' own QuantizedCache on the same windows, as anchor rows (uncorrected: its attention is plain),
    # at the bits and group size of the integer RTN preset: backends quanto | hqq (null / []: none)
    hf_anchors: list[str] = field(default_factory=list)
    values: str = "same"                        # same: values quantized like keys (KIVI: per token); none: full
    attention: LlmAttentionConfig = field(default_factory=LlmAttentionConfig)
    workers: int = 2                            # processes, each a share of the windows (one torch thread each)
    paths: PathsConfig = field(default_factory=PathsConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    experiment_name: str = "llm_prefill"        # bookkeeping only (W&B group); not part of a run id

    def __post_init__(self) -> None:
        for key in ("quantizers", "treatments", "sink_quantizers"):
            value = getattr(self, key)
            if isinstance(value, str) or len(set(value)) != len(value):
                fail(key, value, "must be a list of distinct names")
        if not self.quantizers:
            fail("quantizers", self.quantizers, "must name at least one configs/quant preset")
        if not self.treatments:
            fail("treatments", self.treatments, f"must name at least one of {tuple(TREATMENTS)}")
        for name in self.treatments:
            check_choice("treatments", name, tuple(TREATMENTS))
        for key in ("sink_quantizers", "attention.diagnostic_quantizers"):
            for name in (self.sink_quantizers if key == "sink_quantizers" else self.attention.diagnostic_quantizers):
                if name not in self.quantizers:
                    fail(key, name, f"must be one of quantizers={list(self.quantizers)}")
        if isinstance(self.hf_anchors, str) or len(set(self.hf_anchors)) != len(self.hf_anchors):
            fail("hf_anchors", self.hf_anchors, f"must be a list of distinct backends from {HF_BACKENDS}")
        for name in self.hf_anchors:
            check_choice("hf_anchors", name, HF_BACKENDS)
        check_choice("values", self.values, ("same", "none"))
        check_int("workers", self.workers, 1)


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="llm_schema", node=LlmPrefillConfig)


def compose(overrides: list[str]) -> LlmPrefillConfig:
    """The typed config for ``overrides`` (Hydra's compose API over ``configs/llm``, onto ``llm_schema``)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from omegaconf import OmegaConf

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR / "llm"), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    check_finite_tree(OmegaConf.to_container(cfg, resolve=True))
    typed = OmegaConf.to_object(cfg)
    resolve_wandb_mode(typed.logger.mode)  # WANDB_MODE, which wins over logger.mode: checked before any work
    return typed


@dataclass(frozen=True)
class RunPlan:
    """One run: a suite quantizer (key / value QuantConfigs, sink tokens) or a transformers anchor (``anchor``)."""

    preset: str
    sink_tokens: int
    key: QuantConfig | None
    value: QuantConfig | None
    identity: dict
    run_id: str
    anchor: dict | None = None
    diagnostics: bool = False

    def work(self) -> tuple:
        """What a worker needs (plain data: it crosses a process boundary)."""
        if self.anchor is not None:
            return (self.run_id, "anchor", self.anchor)
        return (self.run_id, "suite", {"key": dataclasses.asdict(self.key), "sink": self.sink_tokens,
                                       "diagnostics": self.diagnostics})

    def labels(self, model: str) -> dict:
        from jensenkv.report.rows import quantizer_label

        if self.anchor is not None:
            a = self.anchor
            return {"model": model, "preset": self.preset, "quantizer": self.preset,
                    "label": f"transformers QuantizedCache ({a['backend']}, axis {a['axis_key']})",
                    "bits": a["nbits"], "group_size": a["q_group_size"], "granularity": "transformers",
                    "sink_tokens": 0}
        key = self.key
        row = {"quantizer": key.label, "zero_point": "symmetric" if key.symmetric else key.zero_convention,
               "dither": key.dither, "smoothing": key.smoothing, "rotation": key.rotation,
               "qvg_centroids": key.qvg_centroids if key.method == "qvg" else None}
        return {"model": model, "preset": self.preset, "quantizer": key.label, "label": quantizer_label(row),
                "bits": key.bits, "group_size": key.group_size, "granularity": key.granularity,
                "sink_tokens": self.sink_tokens}


def quant_preset(name: str) -> QuantConfig:
    """A ``configs/quant`` preset as the video runs compose it (one definition of every quantizer)."""
    from jensenkv.config.resolve import compose_config

    presets = sorted(path.stem for path in (CONFIG_DIR / "quant").glob("*.yaml"))
    if name not in presets:
        raise ValueError(f"quantizers: {name!r} is not allowed: use presets of configs/quant {tuple(presets)}")
    return QuantConfig.from_dict(compose_config([f"quant={name}"]).quant)


def plan_runs(cfg: LlmPrefillConfig, weights_digest: str, sources: list[dict], head_dim: int) -> list[RunPlan]:
    """Every run of the experiment, from the config and what it reads (weights digest, text identities)."""
    from jensenkv.cache import CacheSettings

    from jensenkv.llm.anchors import anchor_settings

    common = {
        "experiment": STORE_FOLDER,
        "model": {"name": cfg.llm.name, "weights_digest": weights_digest, "dtype": cfg.llm.dtype},
        "text": {"sources": sources, "windows_per_source": cfg.text.windows_per_source,
                 "length": cfg.text.length, "prefix": cfg.text.prefix},
    }
    runs = []
    for preset in cfg.quantizers:
        quant = quant_preset(preset)
        key, value = CacheSettings(values=cfg.values, full_precision_dtype="float32").key_value(quant, head_dim)
        diagnostics = preset in cfg.attention.diagnostic_quantizers
        for sink in ([0, 1] if preset in cfg.sink_quantizers else [0]):
            identity = {**common, "key": dataclasses.asdict(key), "value": dataclasses.asdict(value),
                        "sink_tokens": sink, "treatments": list(cfg.treatments), "backend": cfg.attention.backend,
                        "probe_layers": cfg.attention.probe_layers, "diagnostics": diagnostics}
            runs.append(RunPlan(preset, sink, key, value, identity, config_hash(identity), diagnostics=diagnostics))
    reference = quant_preset("rtn")  # the anchors quantize at the integer RTN preset's bits and group size
    for backend in cfg.hf_anchors:
        anchor = anchor_settings(backend, reference.bits, reference.group_size)
        identity = {**common, "anchor": anchor, "treatments": ["none"]}
        runs.append(RunPlan(f"hf_{backend}", 0, None, None, identity, config_hash(identity), anchor=anchor))
    return runs
