"""The typed config tree: ``RunConfig`` composes one node per concern, each defined next to the code that obeys it.

    RunConfig
      model: ModelConfig            jensenkv.models.config: which network (composed from the families' nodes)
      generation: RunGenerationConfig  jensenkv.models.config: how a video is sampled chunk by chunk (the loop's
                                    GenerationConfig plus the families' nodes)
      quant: QuantConfig            jensenkv.quant.config: the key quantizer preset
      cache: CacheSettings          jensenkv.cache: values same|none, sink chunks, window, full-precision dtype
      attention: AttentionConfig    jensenkv.attention.config: backend, correction, strength, probes
      eval: EvalConfig              jensenkv.eval.config: prompts, seeds, metrics, LPIPS, VBench
      logger: LoggerConfig          jensenkv.config.logger: W&B
      paths: PathsConfig, threads, experiment_name

Hydra composes ``configs/`` on top of these schemas (``register_configs`` puts ``RunConfig`` in Hydra's
ConfigStore as ``run_schema``, which ``configs/config.yaml`` lists first), so every field exists with its
default, is type-checked and can be overridden from the command line (``generation.kv_range=[4,3,2,1]``,
``attention.backend=reference``). ``OmegaConf.to_object`` then builds the dataclasses, and each node
validates itself in ``__post_init__``: a ValueError naming the key, the value and what is allowed.
A preset file (``configs/quant/rtn.yaml``) only states how it differs from these defaults.

Building the tree reads no file: the checks that need the model's config files, its weights or a calibration
file run in one resolve step (``jensenkv.config.resolve.resolve``), which also computes the digests a run id hashes.
Settings a method ignores are reset here (QVG fields of an RTN run, every quantizer field of a BF16 run, the
correction of a run with nothing quantized), so equal runs get equal ids.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from jensenkv.attention.backends import check_backend_storage
from jensenkv.attention.config import AttentionConfig
from jensenkv.cache import CacheConfig, CacheSettings
from jensenkv.checks import check_int, fail
from jensenkv.eval.config import EvalConfig
from jensenkv.models.config import ModelConfig, RunGenerationConfig
from jensenkv.models.registry import family
from jensenkv.quant.config import QuantConfig
from jensenkv.generation.teacher_forced import check_teacher_forced
from jensenkv.config.logger import LoggerConfig


@dataclass
class PathsConfig:
    results_dir: str = "${oc.env:JENSENKV_RESULTS,results}"  # runs/, refs/, wandb/ live here

    def __post_init__(self) -> None:
        if not isinstance(self.results_dir, str) or not self.results_dir.strip():
            fail("paths.results_dir", self.results_dir, "must be a folder path (default: $JENSENKV_RESULTS, else "
                 "results); set paths.results_dir=... or JENSENKV_RESULTS")


@dataclass
class RunConfig:
    """One run: a (model, generation, quantizer, cache, attention, eval) point. Validated on construction."""

    model: ModelConfig = field(default_factory=ModelConfig)
    generation: RunGenerationConfig = field(default_factory=RunGenerationConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    cache: CacheSettings = field(default_factory=CacheSettings)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(prompts=["a red square moving right on a dark "
                                                                         "background"]))
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    threads: Optional[int] = None      # torch threads; null: 1 for the built-in model, else the cores shared out
                                       # between parallel local jobs, at most 4 (run.environment.default_threads);
                                       # OMP_NUM_THREADS, when set, wins
    experiment_name: str = "default"   # bookkeeping only (W&B group); not part of the run id

    def __post_init__(self) -> None:
        check_int("threads", self.threads, 1, optional=True)
        own = family(self.model.kind)
        own.check_generation(self.model, self.generation, self.eval.prompts)
        own.check_batch(self.generation)
        own.check_backend(self.attention.backend)
        self._check_indices()
        if "teacher_forced" in self.eval.metrics:
            check_teacher_forced(self.generation)
        self.key, self.value = self.cache.key_value(self.quant)  # the checks that need the head dim: resolve
        check_backend_storage(self.attention.backend, self.key, self.value)  # before any model loads
        if self.is_reference:  # nothing quantized: nothing to correct
            self.attention = dataclasses.replace(self.attention, correction="none", strength=1.0, second_order=False)
        if self.attention.correction == "none":  # no bias to scale: the file changes nothing
            self.attention = dataclasses.replace(self.attention, calibration=None)
        self.attention = dataclasses.replace(self.attention, probes="attention" in self.eval.metrics)

    def _check_indices(self) -> None:
        """Probe steps and sink chunks against the generation they index: past its end they would make a run
        that silently probes or quantizes nothing (probe layers need the model's depth: jensenkv.config.resolve.resolve)."""
        steps, chunks, sinks = self.generation.steps, self.generation.num_chunks, self.cache.sink_chunks
        for key in ("probe_steps", "diagnostic_steps"):
            value = getattr(self.attention, key)
            if value and max(value) >= steps:
                fail(f"attention.{key}", value, f"denoising step indices must be < generation.steps={steps}")
        if sinks and sinks >= chunks - 1:  # chunk i reads chunks 0..i-1 only: all of them sinks
            window = "" if self.cache.window_chunks is None else \
                f" (cache.window_chunks={self.cache.window_chunks} limits only the chunks after the sinks)"
            fail("cache.sink_chunks", sinks, f"must be < generation.num_chunks - 1 = {chunks - 1}: a chunk reads only "
                 f"the chunks before it, so with {sinks} sink chunks no quantized chunk is ever read{window}")

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

    def cache_config(self, keep_reference: bool) -> CacheConfig:
        """The quantized cache of this run."""
        return CacheConfig(key=self.key, value=self.value, sink_chunks=self.cache.sink_chunks,
                           window_chunks=self.cache.window_chunks, keep_reference=keep_reference)

    def reference_cache_config(self) -> CacheConfig:
        """The BF16 reference cache: same layout, nothing quantized, stored in cache.full_precision_dtype."""
        full = self.cache.full_precision()
        return CacheConfig(key=full, value=full, sink_chunks=self.cache.sink_chunks,
                           window_chunks=self.cache.window_chunks)


def register_configs() -> None:
    """Put the tree's schema in Hydra's ConfigStore (``configs/config.yaml`` lists ``run_schema`` first)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    schema = OmegaConf.structured(RunConfig)
    # the default as written, not as this host resolved it on import: build_spec resolves it where the run
    # runs, or as on the node a SLURM job is planned for (jensenkv.devices)
    schema.model.device = "auto"
    ConfigStore.instance().store(name="run_schema", node=schema)
