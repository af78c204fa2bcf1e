"""The config tree of the LLM partial-prefill experiment (``python -m jensenkv.llm``), composed by Hydra from
``configs/llm/`` onto ``LlmPrefillConfig`` (its schema ``llm_schema``). Every field has its default here; each
node checks itself and fails in one line naming the key, the value and what is allowed.

    LlmPrefillConfig
      llm: LlmModelConfig     which causal LM (a preset of jensenkv.llm.weights, a Hub id in the cache, a folder)
      text: TextConfig        sources, windows per source, window length L, quantized prefix P
      quantizers              configs/quant presets, each one run (the Table 1 ones by default)
      treatments              corrections over the same stored prefix: none | taylor | exact | taylor2
      sink_quantizers         presets also run with the first token kept in full precision (an attention sink)
      attention               backend, probed layers, error-model diagnostics
      workers, paths, logger, experiment_name
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from jensenkv.attention._inputs import CAUSAL_BACKENDS
from jensenkv.checks import check_choice, check_int, fail
from jensenkv.config import PathsConfig
from jensenkv.llm.prefill import TREATMENTS
from jensenkv.llm.text import SOURCES
from jensenkv.quant.config import FLOAT_DTYPES
from jensenkv.tracking import LoggerConfig


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
    diagnostics: bool = True                    # the error-model split (em_*) in every probe

    def __post_init__(self) -> None:
        check_choice("attention.backend", self.backend, CAUSAL_BACKENDS)
        if self.probe_layers is not None and (isinstance(self.probe_layers, str) or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.probe_layers)):
            fail("attention.probe_layers", self.probe_layers, "use null (all) or a list of layer indices >= 0")
        if not isinstance(self.diagnostics, bool):
            fail("attention.diagnostics", self.diagnostics, "must be true or false")


TABLE1_QUANTIZERS = ["rtn", "rtn_min_aligned", "rtn_dither", "quarot", "kivi", "qvg", "rtn_int4"]


@dataclass
class LlmPrefillConfig:
    llm: LlmModelConfig = field(default_factory=LlmModelConfig)
    text: TextConfig = field(default_factory=TextConfig)
    quantizers: list[str] = field(default_factory=lambda: list(TABLE1_QUANTIZERS))  # configs/quant presets
    treatments: list[str] = field(default_factory=lambda: ["none", "taylor", "exact", "taylor2"])
    sink_quantizers: list[str] = field(default_factory=lambda: ["rtn"])  # also run with a full-precision sink token
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
        for name in self.sink_quantizers:
            if name not in self.quantizers:
                fail("sink_quantizers", name, f"must be one of quantizers={list(self.quantizers)}")
        check_choice("values", self.values, ("same", "none"))
        check_int("workers", self.workers, 1)


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="llm_schema", node=LlmPrefillConfig)
