"""HY-WorldPlay's own node of the generation config (``generation.worldplay``): memory, inputs and latent storage.

``WorldPlayGenerationNode`` is what the family adds to the run's generation node (``jensenkv.models.config.
RunGenerationConfig``); the WorldPlay family requires it and every other family refuses it
(``ModelFamily.check_generation``). Pure data: no model code, no torch at import.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from jensenkv.checks import check_choice, check_finite, check_int, fail
from jensenkv.models.family import node_from_dict
from jensenkv.models.worldplay.config import MEMORY_MODES

LATENT_DTYPES = ("float32", "bfloat16")
SCENE_KEYS = ("prompt", "image", "trajectory")


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
        check_choice("generation.worldplay.memory", self.memory, MEMORY_MODES)
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
        return node_from_dict(cls, "generation.worldplay", values)

    def inputs(self, prompt: str) -> tuple[Optional[str], str]:
        """(image, trajectory) of a prompt: its scene's, else the defaults."""
        for scene in self.scenes or ():
            if scene["prompt"] == prompt:
                return (scene["image"] if scene["image"] is not None else self.image,
                        scene["trajectory"] if scene["trajectory"] is not None else self.trajectory)
        return self.image, self.trajectory


@dataclass
class WorldPlayGenerationNode:
    """The WorldPlay family's part of the run's generation node: ``generation.worldplay`` (null for every other
    family)."""

    worldplay: Optional[WorldPlaySettings] = None  # HY-WorldPlay's memory, inputs and latent storage

    def __post_init__(self) -> None:
        if isinstance(self.worldplay, dict):
            self.worldplay = WorldPlaySettings.from_dict(self.worldplay)
