"""What a model family answers for the rest of the suite: the one object each family package registers.

The rest of the suite never asks which family a model is: it asks the family (``models.registry.family``)
for the fields it reads, the model's geometry, the files it needs, a weights digest, which attention
backends and metrics it supports, and the adapter. A family reads files here only in ``geometry``,
``check_weights``, ``files`` and ``weights_digest``, which the run's resolve step (``jensenkv.config.resolve``)
calls; ``check`` and ``check_generation`` are pure functions of the config values.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional

from jensenkv.checks import check_choice, check_int, fail
from jensenkv.quant.config import FLOAT_DTYPES


@dataclass(frozen=True)
class Geometry:
    """The attention shape of a model at a generation setting, from config files only."""

    head_dim: int           # channels per head d
    heads: int              # query heads per layer
    kv_heads: int           # key / value heads per layer (GQA: fewer than heads)
    layers: int             # self-attention layers
    tokens_per_chunk: int   # tokens of one chunk: frames_per_chunk x latent tokens per frame


@dataclass(frozen=True)
class Download:
    """One thing ``make fetch-weights`` downloads for a model: what, where to, and from where."""

    name: str                      # e.g. "model skyreels_v2_df_1_3b"
    target: Path                   # the file, or the Hugging Face cache folder of a snapshot
    source: str                    # a Hub repo id, "repo::file in it", or a URL
    how: str                       # hf-snapshot | hf-file | file
    patterns: tuple[str, ...] = ()  # hf-snapshot: the files of the repo it needs (empty: all)


def node_from_dict(cls: type, key: str, values: Mapping[str, Any]) -> Any:
    """A node dataclass from a mapping; unknown keys are one line naming ``key`` and the allowed keys."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        fail(key, unknown, f"unknown keys; allowed: {sorted(known)}")
    return cls(**dict(values))


@dataclass
class CheckpointNode:
    """The fields every family with a real checkpoint reads (one declaration, so they agree by construction)."""

    path: Optional[str] = None         # a local folder, or a Hub id already in the Hugging Face cache
    cache_dir: Optional[str] = None    # the Hugging Face cache (null: HF_HUB_CACHE)
    height: Optional[int] = None       # pixels
    width: Optional[int] = None        # pixels
    fps: Optional[int] = None          # frames per second the model is conditioned on (null: its default)
    vae_dtype: Optional[str] = None    # null: model.dtype

    @staticmethod
    def check(model: Any) -> None:
        if model.vae_dtype is not None:
            check_choice("model.vae_dtype", model.vae_dtype, tuple(FLOAT_DTYPES))
        check_int("model.fps", model.fps, 1, optional=True)


@dataclass(frozen=True)
class NodeResources:
    """What one run needs on a node (the SLURM launcher's gpus_per_node, cpus_per_task, mem_gb)."""
    gpus: int
    cpus: int
    mem_gb: int


class ModelFamily:
    """Base of a family: the defaults every family may keep. Subclasses set the class attributes."""

    kind: ClassVar[str]                                  # model.kind that selects the family
    node: ClassVar[type]                                 # dataclass of the model.* fields it reads
    packages: ClassVar[tuple[tuple[str, str], ...]] = ()  # (module, pip requirement) its code imports
    refused_backends: ClassVar[Mapping[str, str]] = {}   # attention backends it cannot use, with the reason
    # metrics it cannot provide, with the reason; content recovery needs the built-in model's prompt grammar
    metric_limits: ClassVar[Mapping[str, str]] = {
        "content": "content recovery reads the built-in model's procedural videos only (model.kind=tiny)"}
    threads: ClassVar[int | None] = None                 # torch threads when `threads` is null (None: cores shared)
    batches: ClassVar[bool] = True                       # its adapter runs several videos per forward
    cpu_batch_size: ClassVar[int] = 1                    # generation.batch_size=auto on a CPU (measured, README)
    extra_chunks_in_flight: ClassVar[int] = 0            # chunks a forward carries beyond the window (MAGI: 1)
    late: ClassVar[bool] = False  # added after the committed run ids: its own fields hash only when set
    licence: ClassVar[str | None] = None                 # conditions of use of its weights (``make check-weights``)
    # dataclass of the family's own generation.* node (one field, FAMILY_GENERATION_NODES), e.g. MagiGenerationNode
    generation_node: ClassVar[type | None] = None
    node_cpus: ClassVar[int] = 8                          # a GPU run's CPUs: data loading, decoding, VBench
    node_memory_gb: ClassVar[int] = 64                    # a GPU run's host memory: weights while loading, VBench

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls.node))

    @classmethod
    def generation_key(cls) -> str | None:
        """The name of the family's own generation node (``generation.<key>``); None: it has none."""
        if cls.generation_node is None:
            return None
        (only,) = dataclasses.fields(cls.generation_node)
        return only.name

    @classmethod
    def view(cls, model: Mapping[str, Any] | Any) -> Any:
        """The family's own typed node of a model config (a ModelConfig or a mapping; absent fields: defaults),
        unvalidated: what the readiness report and ``make fetch-weights`` read from a configs/model/*.yaml."""
        get = model.get if isinstance(model, Mapping) else lambda key, default: getattr(model, key, default)
        return cls.node(**{f.name: get(f.name, f.default) for f in dataclasses.fields(cls.node)})

    # --- pure checks --------------------------------------------------------------------------------------
    def check(self, model: Any) -> None:
        """Checks of the family's own fields (ValueError naming the key, the value and what is allowed)."""

    def check_generation(self, model: Any, generation: Any, prompts: list[str]) -> None:
        """Checks of the generation node against the family, its model and the eval's prompts (all of
        ``eval.prompts``, not only those ``num_prompts`` keeps): a family-specific generation node (MAGI-1
        reads ``generation.magi``, HY-WorldPlay ``generation.worldplay``) is required by its family
        (``generation_node``) and refused by every other; a family refuses there every value its model would
        refuse or ignore once loaded."""
        for node, allowed in FAMILY_GENERATION_NODES.items():
            value = getattr(generation, node)
            if (value is None) == (node == self.generation_key()):
                fail(f"generation.{node}", value, allowed)

    def check_inputs(self, model: Any, generation: Any, prompts: list[str]) -> None:
        """Checks of the input files a run of these prompts reads besides the weights (first frames, camera
        files), before any model loads (``jensenkv.config.resolve.build_spec``): ValueError naming the key, FileNotFoundError
        naming the missing file. Most families read no input file."""

    def model_label(self, model: Any, generation: Any) -> str:
        """The results' "model" column: the tables compare runs of one model label (one context each), so a
        family whose experiment axis lives in generation (WorldPlay's memory mode) names it here."""
        return model.name

    def terms(self, model: Any) -> list[str]:
        """The conditions of use of the weights this model config reads (``make check-weights``)."""
        return [self.licence] if self.licence else []

    def check_batch(self, generation: Any) -> None:
        """A family that generates one video at a time refuses generation.batch_size > 1."""
        if not self.batches and generation.batch_size not in ("auto", 1):
            fail("generation.batch_size", generation.batch_size,
                 f"model.kind={self.kind} generates one video at a time: use 1 or auto")

    def batch_size(self, spec: Any, videos: int) -> int:
        """Videos per batch for a run of ``videos``: generation.batch_size, or "auto" (``auto_batch_size`` on
        model.device), clipped to the videos (at least 1)."""
        size = spec.generation.batch_size
        if size == "auto":
            size = self.auto_batch_size(spec, spec.model.device)
        return max(1, min(int(size), videos))

    def auto_batch_size(self, spec: Any, device: Any) -> int:
        """generation.batch_size=auto: 1 where the family cannot batch; on a CPU its measured default; on a GPU
        as many videos as the free memory holds by ``video_bytes`` (after the model is loaded)."""
        import torch

        if not self.batches:
            return 1
        device = torch.device(device or "cpu")
        if device.type != "cuda" or spec.geometry is None:
            return self.cpu_batch_size
        free, _ = torch.cuda.mem_get_info(device)
        return max(1, min(GPU_MAX_BATCH, int(GPU_MEMORY_SHARE * free // video_bytes(spec, self.extra_chunks_in_flight))))

    def resources(self, model: Any, video: int) -> NodeResources:
        """What a run needs on a node: one GPU unless model.device is the CPU (as written, not resolved on the
        submitting host), ``node_cpus`` and ``node_memory_gb``. ``video``: bytes one video adds
        (``video_bytes``), for families that keep their videos in host memory."""
        return NodeResources(0 if str(model.device) == "cpu" else 1, self.node_cpus, self.node_memory_gb)

    def check_backend(self, backend: str) -> None:
        """Every registered backend (jensenkv.attention.ATTENTION_BACKENDS) but the refused ones."""
        if backend in self.refused_backends:
            from jensenkv.attention.backends import ATTENTION_BACKENDS

            allowed = tuple(name for name in ATTENTION_BACKENDS if name not in self.refused_backends)
            fail("attention.backend", backend,
                 f"model.kind={self.kind} cannot use it ({self.refused_backends[backend]}); it allows {allowed}")

    # --- what needs files -------------------------------------------------------------------------------
    def geometry(self, model: Any, generation: Any) -> Geometry | None:
        """The model's attention shape from config files only; None when they are absent or unreadable
        (``check_weights`` then names the missing file)."""
        return None

    def check_weights(self, model: Any) -> None:
        """Raise FileNotFoundError naming the first missing file and where it is looked for."""

    def files(self, model: Any) -> list[tuple[Path, bool]]:
        """Every file or folder the loader reads, with whether it is present (``make check-weights``)."""
        return []

    def downloads(self, name: str, model: Mapping[str, Any]) -> list[Download]:
        """What ``make fetch-weights`` fetches for the model config ``name`` (a resolved mapping)."""
        return []

    def weights_digest(self, model: Any) -> str | None:
        """A digest of the weights for the run id (None: the model config names the weights itself)."""
        return None

    def input_digests(self, model: Any, generation: Any, prompts: list[str]) -> dict[str, str | None] | None:
        """Per prompt, a digest of the input files its video depends on (so a changed image changes the run id);
        None: the family reads no input file."""
        return None

    def build_adapter(self, model: Any, cache: Any, attention: Any, generation: Any) -> Any:
        """The chunk-wise adapter (a ``jensenkv.generation.loop.ChunkwiseAdapterBase``) of ``model`` with that cache,
        attention settings and sampler."""
        raise NotImplementedError


# generation nodes that belong to one family: name -> what the one-line error says is allowed
FAMILY_GENERATION_NODES = {
    "magi": "MAGI-1 models need it (configs/model/magi1_*.yaml set it) and other models must leave it null",
    "worldplay": "HY-WorldPlay models need it (configs/model/worldplay_*.yaml set it) and other models must "
                 "leave it null",
}

GPU_MEMORY_SHARE = 0.8  # of the free memory after loading the model: the rest is the allocator's slack
GPU_MAX_BATCH = 64      # beyond this a forward is long enough: more videos only delay the first result
ACTIVATION_COPIES = 24  # live (tokens, hidden) float32 tensors of one block's forward (attention + 4x FFN)


def video_bytes(spec: Any, extra_chunks: int = 0) -> int:
    """GPU memory one video of a batch adds (the "auto" batch's model, README GPU-memory table): its caches
    in every branch and layer (full precision, the worst case: the BF16 reference; twice with the probes'
    reference copies) and one block's activations over its tokens in flight (the window, plus ``extra_chunks``
    a family's forward carries, e.g. MAGI-1's refreshed clean chunk). The attention paths tile their
    score matrices to a fixed number of elements (``attention._inputs.TILE_ELEMENTS``), so those do not grow
    with the batch, and each video is decoded alone."""
    g, gen = spec.geometry, spec.generation
    branches = 2 if gen.use_cfg else 1
    element = 4 if spec.cache.full_precision_dtype == "float32" else 2
    tokens_cached = g.tokens_per_chunk * gen.num_chunks
    cache = 2 * g.layers * g.kv_heads * g.head_dim * tokens_cached * element * branches
    if spec.attention.probes:
        cache *= 2
    in_flight = g.tokens_per_chunk * (gen.window_size + extra_chunks) * branches
    activations = ACTIVATION_COPIES * in_flight * g.heads * g.head_dim * 4
    return cache + activations


def file_digest(path: Path) -> str | None:
    """sha256 (16 hex digits) of a file, cached by (path, size, mtime); None when it does not exist."""
    if not path.is_file():
        return None
    stat = path.stat()
    return _file_digest(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def local_model_dir(path: Any, cache_dir: str | None) -> Path | None:
    """A model folder: a local directory, or a Hub id already in the Hugging Face cache (never downloads)."""
    local = Path(str(path)).expanduser()
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=str(path), cache_dir=cache_dir, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or not a repo id): the caller names what is missing
        return None


def cached_model_dir(model: Mapping[str, Any] | Any, looked: list[tuple[Path, bool]]) -> Path | None:
    """The local folder the loader uses (``path`` itself, or its snapshot in the Hugging Face cache), for the
    readiness report: what was looked for is appended to ``looked`` when it is absent."""
    from huggingface_hub import constants

    path, cache_dir = str(getattr(model, "path")), getattr(model, "cache_dir")
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    cache = Path(cache_dir or constants.HF_HUB_CACHE).expanduser()
    if local.is_absolute() or path.startswith((".", "~")) or path.count("/") != 1:
        looked.append((local, False))
        return None
    found = local_model_dir(path, str(cache))
    if found is None:
        looked.append((cache / f"models--{path.replace('/', '--')}", False))
    return found
