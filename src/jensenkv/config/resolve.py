"""A run's specification: the composed Hydra config built into the typed tree (jensenkv.config.RunConfig),
then resolved against this machine's files into a ``RunSpec``.

Building the tree is pure: config values only. ``resolve`` is the one step that reads files: the model's
geometry from its config files (the head-dim and chunk-size checks), the weights digest and the calibration
file, the two digests a run id hashes. ``build_spec`` composes, builds and resolves, then checks that the
weights (and, with eval.require_ready, every metric) are there: bad input fails in seconds, before any job
starts, with one line naming the key, the value and what is allowed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Optional

from jensenkv.attention.backends import check_backend_device
from jensenkv.calibration import check_calibration, load_calibration
from jensenkv.checks import check_finite_tree, fail
from jensenkv.config.tree import RunConfig, register_configs
from jensenkv.eval.readiness import require_ready
from jensenkv.models.family import Geometry
from jensenkv.models.registry import family
from jensenkv.config.help import register_help_resolver
from jensenkv.store.record_check import identity_labels
from jensenkv.hashing import config_hash

CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs"  # src/jensenkv/config/resolve.py -> the checkout
CONFIG_GROUPS = ("model", "quant", "correction", "eval", "logger", "experiment")

register_configs()
register_help_resolver()  # configs/config.yaml's hydra.help.template names it: every process that composes has it


@dataclass
class RunSpec(RunConfig):
    """A RunConfig resolved against this machine's files: what its run id hashes is then known. Resolve again
    (``resolve``) after changing a field in place."""

    geometry: Optional[Geometry] = None       # None: the model's config files are absent (check_weights names them)
    weights_digest: Optional[str] = None      # the family's digest of the weights (None: the config names them)
    calibration_digest: Optional[str] = None  # content digest of attention.calibration (None without one)
    # the family's digest of each prompt's input files (WorldPlay: first frame, pose file); None: it reads none
    input_digests: Optional[dict[str, Optional[str]]] = None

    def identity(self) -> dict:
        """What the run id hashes: everything that changes the run's videos or metrics."""
        metrics = sorted(self.eval.metrics)
        probes = self.attention.probes
        return self._with_inputs(self.prompts) | {
            "model": self.model.to_dict(),
            "weights": self.weights_digest,
            "generation": self.generation.sampling(),
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
            "probe_layers": self.attention.probe_layers if probes else None,
            "probe_steps": self.attention.probe_steps if probes else None,
            "diagnostics": self.attention.diagnostics and probes,
            "head_moments": self.attention.head_moments and probes,
            # added after the committed run ids: hashed only when set, so the others keep theirs
            **({"diagnostic_steps": self.attention.diagnostic_steps}
               if probes and self.attention.diagnostic_steps is not None else {}),
            "prompts": self.prompts,
            "seeds": list(self.eval.seeds),
            "metrics": metrics,
            "lpips_net": self.eval.lpips.net if "lpips" in metrics else None,
            "vbench_dimensions": sorted(self.eval.vbench.dimensions) if "vbench" in metrics else None,
            "fps": self.eval.fps,
        }

    @property
    def run_id(self) -> str:
        return config_hash(self.identity())

    def reference_identity(self, prompt: str, seed: int) -> dict:
        """What a BF16 reference video depends on: model, generation, prompt, seed and the cache layout."""
        return self._with_inputs([prompt]) | {"kind": "full-precision reference", "model": self.model.to_dict(),
                "weights": self.weights_digest, "generation": self.generation.sampling(),
                "prompt": prompt, "seed": int(seed),
                "sink_chunks": self.cache.sink_chunks, "window_chunks": self.cache.window_chunks,
                "full_precision_dtype": self.cache.full_precision_dtype, "backend": self.attention.backend}

    def _with_inputs(self, prompts: list[str]) -> dict:
        """{"inputs": the prompts' input-file digests} when the family reads input files, else {} (ids as before)."""
        if self.input_digests is None:
            return {}
        return {"inputs": [self.input_digests.get(p) for p in prompts]}

    def labels(self) -> dict:
        """Columns of the results table that describe the run: what its identity gives (the one derivation,
        which every read of its record repeats)."""
        return identity_labels(self.identity())


def resolve(config: RunConfig) -> RunSpec:
    """The tree resolved against the model's files: the checks that need its geometry (the head dim, the tokens
    of a chunk), the weights digest and the calibration file (ValueError naming the key, the value and what
    is allowed). Missing files are not an error here: ``check_weights`` names them."""
    own = family(config.model.kind)
    geometry = own.geometry(config.model, config.generation)
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(RunConfig)}
    spec = RunSpec(**values, geometry=geometry, weights_digest=own.weights_digest(config.model),
                   input_digests=own.input_digests(config.model, config.generation, config.prompts))
    if geometry is not None:
        spec.cache.key_value(spec.quant, geometry.head_dim)  # group divisibility, power-of-two Hadamard
        tokens, key = geometry.tokens_per_chunk, spec.key
        if key.method == "qvg" and key.qvg_centroids > tokens:
            fail("quant.qvg_centroids", key.qvg_centroids,
                 f"must be <= the {tokens} tokens of one chunk of model {spec.model.name!r}")
        if key.granularity == "channel" and key.method != "none" and key.group_size > tokens:
            fail("quant.group_size", key.group_size,
                 f"with granularity=channel it counts tokens and must be <= the {tokens} tokens of a chunk")
    check_backend_device(spec.attention.backend, spec.model.device)  # this machine's: a GPU, or the interpreter
    if geometry is not None and spec.attention.probe_layers and max(spec.attention.probe_layers) >= geometry.layers:
        fail("attention.probe_layers", spec.attention.probe_layers,
             f"layer indices must be < the {geometry.layers} layers of model {spec.model.name!r}")
    if spec.attention.calibration is not None:  # refused here, before any model is loaded
        shape = (geometry.layers, geometry.heads) if geometry is not None else None
        spec.calibration_digest = check_calibration(spec, shape).digest
    return spec


def compose_config(overrides: Sequence[str] = (), hydra_config: bool = False) -> Any:
    """The composed config for ``overrides`` (Hydra's compose API: no output dir, no launcher)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra_config)


def field_error_line(error: Exception) -> str:
    """An OmegaConf / Hydra validation error as one line: its first line plus the full key."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    full_key = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("full_key:")), None)
    head = lines[0] if lines else type(error).__name__
    return f"{full_key}: {head}" if full_key else head


def unknown_schema_key(key: str) -> tuple[str, str, list[str]] | None:
    """(parent, name, the keys the parent has) for the first part of a dotted ``key`` the schema (RunConfig)
    lacks; None when every part exists or the key reaches into a free mapping (``model.model_overrides``)."""
    import typing

    node: Any = RunConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            return None
        hints = typing.get_type_hints(node)
        names = [f.name for f in dataclasses.fields(node)]
        if part not in names:
            return ".".join(parts[:i]), part, names
        node = hints[part]
        if typing.get_origin(node) is typing.Union:  # Optional[X]: X
            node = next((a for a in typing.get_args(node) if a is not type(None)), None)
    return None


def build_spec(cfg: Any) -> RunSpec:
    """The composed Hydra config as the typed tree, resolved; raises ValueError naming the bad key,
    FileNotFoundError naming a missing weights or input file."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    named_calibration = OmegaConf.select(cfg, "attention.calibration", default=None) \
        if isinstance(cfg, DictConfig) else None
    if isinstance(cfg, RunConfig):
        check_finite_tree(dataclasses.asdict(cfg))
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
            check_finite_tree(OmegaConf.to_container(cfg, resolve=True))  # before any node checks itself
            spec = OmegaConf.to_object(cfg)
        except OmegaConfBaseException as e:
            cause = e.__cause__ if isinstance(e.__cause__, (ValueError, FileNotFoundError)) else None
            if cause is not None:
                raise cause from None
            raise ValueError(field_error_line(e)) from None
    if isinstance(named_calibration, str) and spec.attention.calibration is None:
        load_calibration(named_calibration)  # ignored without a correction, but a path naming no file is a typo
    spec = resolve(spec)
    own = family(spec.model.kind)
    own.check_weights(spec.model)
    own.check_inputs(spec.model, spec.generation, spec.prompts)  # input files (first frames, camera files)
    if spec.eval.require_ready:  # every requested metric must be computable before any video is made
        require_ready(spec.eval.metrics, spec.eval.vbench.dimensions if "vbench" in spec.eval.metrics else (),
                      spec.eval.lpips.net)
    return spec
