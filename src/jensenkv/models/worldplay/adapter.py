"""Drive HY-WorldPlay chunk by chunk: the generator's ``ChunkwiseModel`` contract on the transformer and caches
(``jensenkv.models.worldplay.model`` / ``cache``), WorldPlay's ``_ar_rollout_inner``.

``jensenkv.generation.loop.generate_video`` draws each chunk's noise, runs the Euler steps on WorldPlay's
float32 schedule (``noise_levels``), keeps latents in ``latent_dtype`` between steps and combines CFG; here:
* ``set_prompt``: the prompt's (image, trajectory) (``settings``, the run's ``generation.worldplay``: its scene
  or the defaults), the cameras and actions of every latent frame, the first frame's latent in frame 0 of the
  condition channels (mask 1), and the text stream run once per branch (the negative prompt's in its own
  caches);
* the first ``denoise_window`` of a chunk selects its memory (``memory.MemorySelector``) and writes it to the
  caches: ``rebuild`` runs the selected clean frames through the context pass at stabilization_level - 1
  and re-commits (re-quantizes) all of them; ``append`` commits only the frames not yet held;
* each step denoises the chunk over [text | memory | current] at sigma x 1000 (float32);
* ``commit`` keeps the clean chunk in the latent history the next chunks' memory is drawn from.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from jensenkv.cache import CacheConfig, ChunkedKVCache
from jensenkv.generation.config import GenerationConfig
from jensenkv.generation.loop import ChunkwiseAdapterBase
from jensenkv.models.worldplay.memory import MemorySelector, MemorySettings
from jensenkv.models.worldplay.schedule import model_timestep, worldplay_sigmas
from jensenkv.models.worldplay.settings import WorldPlaySettings
from jensenkv.models.worldplay.trajectory import Trajectory, load_trajectory
from jensenkv.models.worldplay.vae import condition_latents, random_image, read_image

BRANCHES = ("cond", "uncond")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def memory_settings(wp: WorldPlaySettings, chunk_frames: int) -> MemorySettings:
    return MemorySettings(mode=wp.memory, memory_frames=wp.memory_frames, context_frames=wp.context_frames,
                          sink_frames=wp.sink_frames, chunk_frames=chunk_frames,
                          fov_degrees=tuple(wp.fov_degrees), fov_distance=wp.fov_distance, fov_points=wp.fov_points,
                          fov_radius=wp.fov_radius, fov_seed=wp.fov_seed)


class WorldPlayChunkwiseAdapter(ChunkwiseAdapterBase):
    """HY-WorldPlay transformer + encoders + VAE behind the generator's ``ChunkwiseModel`` contract (one video
    at a time, one forward per CFG branch)."""

    def __init__(self, model: Any, encode_prompt: Any, vae: Any, latent_frame_shape: tuple[int, int, int],
                 pixel_size: tuple[int, int], generation: GenerationConfig, cache: CacheConfig, attention: Any = None,
                 image_seed: int = 0, tiny: bool = False, settings: WorldPlaySettings | None = None):
        from jensenkv.attention.config import AttentionConfig
        from jensenkv.models.worldplay.cache import WorldPlayCaches

        generation.validate()
        self.model = model.eval()
        self.encode_prompt = encode_prompt
        self.vae = vae
        self.latent_frame_shape = tuple(int(x) for x in latent_frame_shape)
        self.pixel_size = pixel_size
        self.generation = generation
        self.settings = settings if settings is not None else WorldPlaySettings()  # generation.worldplay
        self.image_seed = image_seed
        self.tiny = tiny
        self.latent_dtype = None if self.settings.latent_dtype == "float32" else _DTYPES[self.settings.latent_dtype]
        cfg = model.config
        attention = attention if attention is not None else AttentionConfig()
        self._caches = {b: WorldPlayCaches(cfg.num_layers, cfg.num_heads, cfg.head_dim, cache, attention,
                                           memory=self.settings.memory, commit_frames=generation.frames_per_chunk,
                                           text_as_cache=self.settings.text_in_correction, device=self.device)
                        for b in BRANCHES}
        self.selector = MemorySelector(memory_settings(self.settings, generation.frames_per_chunk))
        self.memory_log: list[list[int]] = []   # the frames in memory of each chunk
        self.reset()

    # --- protocol ---------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def quantize_seconds(self) -> float:
        return sum(c.quantize_seconds for c in self._caches.values())

    def noise_levels(self, config: GenerationConfig) -> torch.Tensor:
        """(steps + 1,) WorldPlay's float32 shifted schedule (``schedule.worldplay_sigmas``)."""
        return worldplay_sigmas(config.steps, config.shift)

    def configure(self, cache: CacheConfig | None = None, attention: Any = None) -> None:
        for c in self._caches.values():
            c.configure(cache, attention)
        self.reset()

    def reset(self) -> None:
        for c in self._caches.values():
            c.reset()
        self._history: torch.Tensor | None = None   # (1, C, F_total, h, w) clean latents, filled per chunk
        self._cond: torch.Tensor | None = None      # (1, C + 1, F_total, h, w) image latent + mask
        self._trajectory: Trajectory | None = None
        self._entered: dict[str, int] = {}         # branch -> the chunk whose memory is in its caches
        self.memory_log = []

    def caches(self, branch: str = "cond") -> list[ChunkedKVCache]:
        return self._caches[branch].video_caches()

    def reserve_caches(self, config: GenerationConfig, branches: Sequence[str]) -> None:
        """Size the branches' caches for the video ``config`` generates (the generator's hook). ``append`` keeps
        the whole past, so its caches end holding every frame before the last chunk; ``rebuild`` sizes them at
        each write (``WorldPlayCaches.write_memory``), which knows the frames it writes."""
        if self.settings.memory != "append":
            return
        p_h, p_w = self.model.config.patch_size[1:3]
        _, h, w = self.latent_frame_shape
        for branch in branches:
            self._caches[branch].reserve_memory((config.num_chunks - 1) * config.frames_per_chunk,
                                                (h // p_h) * (w // p_w))

    def probes(self) -> list[dict] | None:
        if not self._caches["cond"].attention.probes:
            return None
        return [r for b in BRANCHES for r in self._caches[b].probe_records]

    @property
    def total_frames(self) -> int:
        return self.generation.num_chunks * self.generation.frames_per_chunk

    def first_frame(self, image: str | None) -> torch.Tensor:
        """(3, H, W) in [-1, 1]: the image file, or (tiny only) a seeded random one."""
        if image is None:
            if not self.tiny:
                raise ValueError("generation.worldplay.image=None is not allowed: the 8B models are image-to-video")
            return random_image(self.pixel_size, self.image_seed)
        return read_image(image, self.pixel_size)

    def set_prompt(self, prompt: str, negative_prompt: str | None = None) -> None:
        """The prompt's inputs (its scene's image and trajectory, else the defaults) and text streams."""
        from jensenkv.models.worldplay.model import TextInputs

        self.reset()
        image_file, spec = self.settings.inputs(prompt)
        self._trajectory = load_trajectory(spec, self.total_frames)
        image = self.first_frame(image_file)
        latent = self.vae.encode(image).to(self.device)  # (1, C, 1, h, w)
        self._cond = condition_latents(latent.float(), self.total_frames)
        c, h, w = self.latent_frame_shape
        self._history = torch.zeros(1, c, self.total_frames, h, w, device=self.device)
        prompts = {"cond": prompt} if negative_prompt is None else {"cond": prompt, "uncond": negative_prompt}
        for branch, text in prompts.items():
            states = self.encode_prompt(text, image)
            inputs = TextInputs(states.text.to(self.device), states.text_mask.to(self.device),
                                states.byt5.to(self.device), states.byt5_mask.to(self.device),
                                states.vision.to(self.device))
            self._caches[branch].set_text(self.model, inputs)

    def camera(self, frames: Sequence[int]) -> Any:
        """CameraInputs of the given latent frames (float64 trajectory cast once to the model's input dtype)."""
        from jensenkv.models.worldplay.model import CameraInputs

        tr = self._trajectory
        dtype = _DTYPES.get(self.model.precision.inputs_dtype or "float32")
        index = list(frames)
        return CameraInputs(tr.w2c[index][None].to(self.device, dtype), tr.intrinsics[index][None].to(self.device, dtype),
                            tr.actions[index][None].to(self.device, dtype))

    def _enter(self, chunk_index: int, branch: str) -> None:
        """A new chunk: select its memory and write it to the branch's caches (the context pass)."""
        if self._entered.get(branch) == chunk_index:
            return
        if len(self.memory_log) <= chunk_index:  # selected once per chunk, shared by the CFG branches
            self.memory_log.append(self.selector(self._trajectory.w2c, chunk_index))
        memory = self.memory_log[chunk_index]
        if memory:
            x = torch.cat([self._history[:, :, memory], self._cond[:, :, memory]], dim=1)  # (1, 2C + 1, n, h, w)
            level = self.settings.stabilization_level - 1
            self._caches[branch].write_memory(self.model, x.to(self.model.dtype), memory, self.camera(memory),
                                              float(level))
        self._entered[branch] = chunk_index

    @torch.no_grad()
    def denoise_window(self, chunks: torch.Tensor, t: Sequence[float], first_chunk_index: int, branch: str = "cond", *,
                       steps: Sequence[int | None] | None = None,
                       kv_ranges: Sequence[int | None] | None = None) -> torch.Tensor:
        """Velocity (1, C, F, h, w) of one chunk (1, C, F, h, w) at noise level t[0]."""
        if len(t) != 1 or (kv_ranges is not None and any(r is not None for r in kv_ranges)):
            raise ValueError(f"t with {len(t)} entries / kv_ranges={kv_ranges} are not allowed: HY-WorldPlay denoises "
                             "one chunk at a time over its selected memory (window_size 1, no kv_range)")
        if branch not in BRANCHES:
            raise ValueError(f"branch={branch!r} is not allowed: use one of {BRANCHES}")
        if self._trajectory is None:
            raise ValueError("no prompt: call set_prompt first")
        if chunks.shape[0] != 1:
            raise ValueError(f"chunks with batch {chunks.shape[0]} are not allowed: HY-WorldPlay generates one video "
                             "at a time (each has its own trajectory and memory)")
        self._enter(first_chunk_index, branch)
        fpc = chunks.shape[2]
        frames = list(range(first_chunk_index * fpc, (first_chunk_index + 1) * fpc))
        x = torch.cat([chunks.to(self.device), self._cond[:, :, frames]], dim=1)  # (1, 2C + 1, F, h, w)
        step = None if steps is None else steps[0]
        v = self._caches[branch].denoise(self.model, x.to(self.model.dtype), model_timestep(float(t[0]), self.device),
                                         self.camera(frames), step=step, chunk=first_chunk_index, branch=branch)
        return v.float()

    @torch.no_grad()
    def commit(self, clean_chunk: torch.Tensor, chunk_index: int, branch: str = "cond", *,
               kv_range: int | None = None) -> None:
        """Keep the clean chunk (1, C, F, h, w) in the history the memory of later chunks is drawn from."""
        fpc = clean_chunk.shape[2]
        self._history[:, :, chunk_index * fpc:(chunk_index + 1) * fpc] = clean_chunk.to(self._history)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latents)


def build_tiny(config: Any, precision: Any, seed: int = 0) -> Any:
    """A seeded random WorldPlayTransformer (weights ~ N(0, 1 / fan_in), biases and gains small around their
    usual values), the global RNG untouched."""
    from jensenkv.models.worldplay.model import WorldPlayTransformer

    gen = torch.Generator().manual_seed(seed)
    model = WorldPlayTransformer(config, precision)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=gen)
            if param.ndim == 1:
                param.copy_(0.1 * noise + (1.0 if _is_gain(param, model) else 0.0))
            else:
                fan_in = param[0].numel()
                param.copy_(noise / fan_in ** 0.5)
    return model.to_precision()


def _is_gain(param: torch.Tensor, model: Any) -> bool:
    """Norm weights (multiplicative gains) start around 1, every other vector around 0."""
    for module in model.modules():
        if isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)) and module.weight is param:
            return True
        if type(module).__name__.endswith("RMSNorm") and getattr(module, "weight", None) is param:
            return True
    return False


def load_worldplay_adapter(cfg: Any, cache: CacheConfig, attention: Any,
                           generation: GenerationConfig) -> WorldPlayChunkwiseAdapter:
    """The adapter of a ``kind: worldplay`` model node (configs/model/worldplay_*.yaml); ``generation`` is the
    run's node (``RunGenerationConfig``): its ``worldplay`` settings go to the adapter."""
    from jensenkv.models.worldplay.node import SPATIAL_DOWNSAMPLE, architecture, pixel_size, precision, worldplay_settings
    from jensenkv.models.worldplay.text import TinyPromptEncoder
    from jensenkv.models.worldplay.vae import TinyVae

    arch, numerics = architecture(cfg), precision(cfg)
    device = torch.device(cfg.device)
    seed = int(cfg.seed or 0)
    if cfg.preset == "tiny":
        model = build_tiny(arch, numerics, seed).to(device)
        text = TinyPromptEncoder(arch.text_states_dim, arch.byt5_states_dim, arch.vision_states_dim, seed=seed)
        vae = TinyVae(arch.latent_channels, seed)
        size = pixel_size(cfg)
        shape = (arch.latent_channels, size[0] // TinyVae.factor, size[1] // TinyVae.factor)
        return WorldPlayChunkwiseAdapter(model, text, vae, shape, size, generation, cache, attention, seed, tiny=True,
                                         settings=worldplay_settings(generation))
    return _load_real(cfg, arch, numerics, device, generation, cache, attention, SPATIAL_DOWNSAMPLE)


def _load_real(cfg: Any, arch: Any, precision: Any, device: torch.device, generation: GenerationConfig,
               cache: CacheConfig, attention: Any, downsample: int) -> WorldPlayChunkwiseAdapter:
    from pathlib import Path

    from jensenkv.models.family import local_model_dir
    from jensenkv.models.loaders import FETCH_HINT, MissingWeightsError
    from jensenkv.models.worldplay.checkpoint import (
        load_transformer,  # part A: the strict official loader
    )
    from jensenkv.models.worldplay.node import PRESET_VARIANTS, worldplay_settings
    from jensenkv.models.worldplay.text import load_prompt_encoder
    from jensenkv.models.worldplay.vae import load_hunyuan_vae

    roots = {}
    for key in ("path", "hunyuan_path"):
        root = local_model_dir(getattr(cfg, key), cfg.cache_dir)
        if root is None:
            raise MissingWeightsError(f"model.{key}={getattr(cfg, key)!r} is neither a local folder nor in the Hugging "
                                      f"Face cache ({cfg.cache_dir or 'HF_HUB_CACHE'}); {FETCH_HINT}")
        roots[key] = root
    folder = roots["path"] / (cfg.variant or PRESET_VARIANTS[cfg.preset])
    model = load_transformer(folder, arch, precision, device)
    dtype = _DTYPES[cfg.dtype]
    text = load_prompt_encoder(roots["hunyuan_path"], dtype, device)
    vae = load_hunyuan_vae(Path(cfg.vae_path).expanduser() if cfg.vae_path else roots["hunyuan_path"] / "vae",
                           _DTYPES[cfg.vae_dtype or cfg.dtype], device)
    shape = (arch.latent_channels, cfg.height // downsample, cfg.width // downsample)
    return WorldPlayChunkwiseAdapter(model, text, vae, shape, (cfg.height, cfg.width), generation, cache, attention,
                                     settings=worldplay_settings(generation))
