"""The generation node of the config tree: how one video is sampled chunk by chunk (``generate.py`` obeys it),
MAGI-1's schedule options beyond the staircase (``generation.magi``, which the MAGI-1 family requires) and
HY-WorldPlay's memory, inputs and latent storage (``generation.worldplay``, which the WorldPlay family requires)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from jensenkv.checks import check_choice, check_finite, check_int, fail, is_int

SAMPLERS = ("euler", "x0_renoise")
T_SCHEDULES = ("sd3", "square", "identity")  # MAGI-1 time schedules
WORLDPLAY_MEMORY = ("rebuild", "append")
LATENT_DTYPES = ("float32", "bfloat16")
SCENE_KEYS = ("prompt", "image", "trajectory")


def _from_dict(cls: type, key: str, values: dict[str, Any]) -> Any:
    """A node dataclass from a mapping; unknown keys are one line naming ``key`` and the allowed keys."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        fail(key, unknown, f"unknown keys; allowed: {sorted(known)}")
    return cls(**dict(values))


def check_kv_range(value: Any, key: str = "generation.kv_range") -> None:
    """A kv-range is null (no limit) or an integer >= 0 (number of visible cached chunks)."""
    check_int(key, value, 0, optional=True)


def _default(spec: dataclasses.Field) -> Any:
    return spec.default_factory() if spec.default is dataclasses.MISSING else spec.default


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
        if not 0.0 == self.cfg_t_range[0] <= self.cfg_t_range[-1] <= 1.0:  # guidance_scales' searchsorted rule
            fail("generation.magi.cfg_t_range", self.cfg_t_range, "it must start at 0 and stay in [0, 1]: a chunk "
                 "time below its first entry would have no guidance scale")
        check_choice("generation.magi.t_schedule", self.t_schedule, T_SCHEDULES)
        check_int("generation.magi.null_caption_tokens", self.null_caption_tokens, 1)
        if self.distill_nearly_clean_chunk_threshold is not None and \
                not 0.0 <= self.distill_nearly_clean_chunk_threshold <= 1.0:
            fail("generation.magi.distill_nearly_clean_chunk_threshold", self.distill_nearly_clean_chunk_threshold,
                 "use null or a MAGI time in [0, 1]")
        if self.distill_dt is not None:
            check_finite("generation.magi.distill_dt", self.distill_dt, 0, strict=True)

    DISTILL_FIELDS = ("distill_nearly_clean_chunk_threshold", "distill_prev_chunks_scale", "distill_dt")

    def distill_changes(self) -> list[str]:
        """The distilled-only fields set away from their defaults (a non-distilled model never reads them)."""
        defaults = MagiScheduleConfig.__dataclass_fields__
        return [k for k in self.DISTILL_FIELDS if getattr(self, k) != _default(defaults[k])]

    def validate(self) -> None:
        self.__post_init__()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MagiScheduleConfig:
        return _from_dict(cls, "generation.magi", values)

    def guidance_scales(self, t: float) -> tuple[float, float]:
        """(prev_chunk_scale, text_scale) of a chunk at MAGI time t (the official searchsorted rule)."""
        import torch

        ranges = torch.tensor(self.cfg_t_range, dtype=torch.float32) - 1e-7
        index = int(torch.searchsorted(ranges, torch.tensor([t], dtype=torch.float32)).item()) - 1
        if not 0 <= index < len(self.prev_chunk_scales):
            raise ValueError(f"chunk time t={t} falls outside generation.magi.cfg_t_range={self.cfg_t_range}")
        return self.prev_chunk_scales[index], self.text_scales[index]


@dataclass
class WorldPlaySettings:
    """HY-WorldPlay's loop beyond the generator's chunks and steps (``generation.worldplay``, docs/WORLDPLAY.md).

    memory: "rebuild" (WorldPlay: before every chunk the cache is rebuilt from the selected frames, so a
        quantized cache is re-quantized every chunk) | "append" (QuantVideoGen's variant: the whole past, no
        retrieval, only the new chunk's tokens written, old codes kept).
    memory_frames / context_frames / sink_frames: rebuild's memory (WorldPlay 20 / 12 / 4): the last
        context_frames, frames 0..sink_frames-1 and retrieved chunks up to memory_frames.
    fov_*: the retrieval's Monte-Carlo view overlap (field of view h x v degrees, distance limit, points in a
        ball of fov_radius drawn from a generator seeded with fov_seed).
    stabilization_level: the context pass runs the clean memory at timestep stabilization_level - 1 (14).
    latent_dtype: latents stored between steps (WorldPlay: bfloat16; the steps themselves are float32).
    trajectory: a preset (forward | turn | orbit), a pose string ("w-15, right-16") or a pose .json file.
    image: the first frame (a PNG/JPEG of model.height x model.width); null: the tiny model draws a seeded
        random one, the 8B models refuse it (they are image-to-video).
    scenes: per-prompt inputs [{prompt, image, trajectory}] (the eval preset configs/eval/worldplay.yaml);
        a prompt not listed uses image and trajectory above.
    text_in_correction: whether the text tokens count as cache for the correction (default: only cached
        video keys are corrected).
    """

    memory: str = "rebuild"
    memory_frames: int = 20
    context_frames: int = 12
    sink_frames: int = 4
    fov_degrees: list[float] = field(default_factory=lambda: [60.0, 35.0])
    fov_distance: float = 8.0
    fov_points: int = 50_000
    fov_radius: float = 8.0
    fov_seed: int = 0
    stabilization_level: int = 15
    latent_dtype: str = "bfloat16"
    trajectory: str = "forward"
    image: Optional[str] = None
    scenes: Optional[list[Any]] = None
    text_in_correction: bool = False

    def __post_init__(self) -> None:
        check_choice("generation.worldplay.memory", self.memory, WORLDPLAY_MEMORY)
        for key, low in (("memory_frames", 1), ("context_frames", 0), ("sink_frames", 0), ("fov_points", 1),
                         ("fov_seed", 0), ("stabilization_level", 1)):
            check_int(f"generation.worldplay.{key}", getattr(self, key), low)
        if self.context_frames + self.sink_frames > self.memory_frames:
            fail("generation.worldplay.memory_frames", self.memory_frames,
                 f"it must hold context_frames={self.context_frames} + sink_frames={self.sink_frames}")
        if isinstance(self.fov_degrees, (str, bytes)) or len(self.fov_degrees) != 2:
            fail("generation.worldplay.fov_degrees", self.fov_degrees, "use [horizontal, vertical] in degrees")
        self.fov_degrees = [float(x) for x in self.fov_degrees]
        for x in self.fov_degrees:
            if not 0 < x <= 360:
                fail("generation.worldplay.fov_degrees", self.fov_degrees, "each angle must be in (0, 360]")
        check_finite("generation.worldplay.fov_distance", self.fov_distance, 0, strict=True)
        check_finite("generation.worldplay.fov_radius", self.fov_radius, 0, strict=True)
        check_choice("generation.worldplay.latent_dtype", self.latent_dtype, LATENT_DTYPES)
        if not isinstance(self.trajectory, str) or not self.trajectory.strip():
            fail("generation.worldplay.trajectory", self.trajectory,
                 "use a preset (forward, turn, orbit), a pose string such as 'w-15, right-16' or a .json pose file")
        if self.image is not None and (not isinstance(self.image, str) or not self.image):
            fail("generation.worldplay.image", self.image, "use null or the path of an image file")
        if not isinstance(self.text_in_correction, bool):
            fail("generation.worldplay.text_in_correction", self.text_in_correction, "must be true or false")
        if self.scenes is not None:
            scenes = []
            for scene in self.scenes:
                scene = dict(scene) if hasattr(scene, "keys") else scene
                if not isinstance(scene, dict) or set(scene) - set(SCENE_KEYS) or not isinstance(scene.get("prompt"), str):
                    fail("generation.worldplay.scenes", scene,
                         f"each scene is a mapping with a prompt and optional image and trajectory ({SCENE_KEYS})")
                scenes.append({k: scene.get(k) for k in SCENE_KEYS})
            self.scenes = scenes

    def validate(self) -> None:
        self.__post_init__()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> WorldPlaySettings:
        return _from_dict(cls, "generation.worldplay", values)

    def inputs(self, prompt: str) -> tuple[Optional[str], str]:
        """(image, trajectory) of a prompt: its scene's, else the defaults."""
        for scene in self.scenes or ():
            if scene["prompt"] == prompt:
                return (scene["image"] if scene["image"] is not None else self.image,
                        scene["trajectory"] if scene["trajectory"] is not None else self.trajectory)
        return self.image, self.trajectory


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
    batch_size: videos generated together in one forward per step, each exactly what it is alone (its own
        noise, cache and probes): an integer >= 1, or "auto" (the model family's choice for the device:
        ``ModelFamily.auto_batch_size``). A batch larger than the run's videos is clipped to them. It changes
        no video, so run ids leave it out (``sampling``).
    """

    num_chunks: int = 4                # chunks generated one after the other: the video's length
    frames_per_chunk: int = 2          # (latent) frames of one chunk
    steps: int = 10                    # denoising steps per chunk
    shift: float = 2.0                 # flow-matching timestep shift (larger: more time at high noise)
    guidance_scale: float = 1.0
    sampler: str = "euler"
    kv_range: Optional[list[Optional[int]]] = None
    commit_kv_range: Optional[int] = None
    negative_prompt: str = ""          # the unconditional branch's prompt of classifier-free guidance
    window_size: int = 1
    magi: Optional[MagiScheduleConfig] = None  # MAGI-1's refresh pass, 3-way / distilled guidance, time schedule
    worldplay: Optional[WorldPlaySettings] = None  # HY-WorldPlay's memory, inputs and latent storage
    batch_size: Any = "auto"  # int >= 1 or "auto"; how the videos are run, not what they are

    def __post_init__(self) -> None:
        if isinstance(self.magi, dict):
            self.magi = MagiScheduleConfig.from_dict(self.magi)
        if isinstance(self.worldplay, dict):
            self.worldplay = WorldPlaySettings.from_dict(self.worldplay)
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
        if self.batch_size != "auto" and not (is_int(self.batch_size) and self.batch_size >= 1):
            fail("generation.batch_size", self.batch_size, 'use "auto" or an integer >= 1 (videos per forward)')

    def validate(self) -> None:
        """Re-check after a field was changed in place (construction already checks)."""
        self.__post_init__()

    EXECUTION_FIELDS = ("batch_size",)  # how the videos are run: no video depends on them

    def sampling(self) -> dict[str, Any]:
        """The fields that decide the videos (what run ids and calibration files record)."""
        values = dataclasses.asdict(self)
        for name in self.EXECUTION_FIELDS:
            values.pop(name)
        if values["worldplay"] is None:  # added after the committed run ids: absent unless set, so they stay
            values.pop("worldplay")
        return values

    @property
    def use_cfg(self) -> bool:
        return self.guidance_scale != 1.0

    def kv_range_at(self, step: int) -> int | None:
        """The kv-range of denoising step ``step`` (0-based): stage = step * stages // steps."""
        if self.kv_range is None:
            return None
        return self.kv_range[step * len(self.kv_range) // self.steps]

