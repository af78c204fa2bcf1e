"""HY-WorldPlay as a family: its presets (a seeded random tiny one, or the official 8B checkpoints of
tencent/HY-WorldPlay on HunyuanVideo-1.5's VAE and encoders), the generation node it requires
(``generation.worldplay``), its input files, geometry, every file it reads and the adapter (docs/WORLDPLAY.md)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from jensenkv.checks import check_choice, check_int, fail
from jensenkv.models.family import CheckpointNode, Download, Geometry, ModelFamily, cached_model_dir, file_digest
from jensenkv.models.worldplay.node import (HUNYUAN_PARTS, LICENCE, PRESET_VARIANTS, PRESETS, SPATIAL_DOWNSAMPLE,
                                            WorldPlayNode, architecture, pixel_size, precision, video_frames,
                                            worldplay_settings)
from jensenkv.models.worldplay.settings import WorldPlayGenerationNode


class WorldPlayFamily(ModelFamily):
    kind = "worldplay"
    node = WorldPlayNode
    packages = (("transformers", "transformers"), ("safetensors", "safetensors"), ("scipy", "scipy"),
                ("PIL", "pillow"))
    generation_node = WorldPlayGenerationNode
    late = True  # its own model fields (hunyuan_path, precision) enter run ids only when set
    licence = LICENCE
    batches = False  # one video at a time: each video has its own trajectory, image and memory selection

    # --- pure checks -------------------------------------------------------------------------------------
    def check(self, model: Any) -> None:
        CheckpointNode.check(model)
        if model.preset is None:
            fail("model.preset", None, f"kind=worldplay needs a preset: one of {PRESETS}")
        check_choice("model.preset", model.preset, PRESETS)
        for key in ("latent_height", "latent_width"):
            check_int(f"model.{key}", getattr(model, key), 1, optional=True)
        check_int("model.seed", model.seed, 0, optional=True)
        if model.preset != "tiny":
            for key in ("path", "hunyuan_path", "height", "width"):
                if getattr(model, key) is None:
                    fail(f"model.{key}", None, f"preset {model.preset} needs path, hunyuan_path, height and width")
            for key in ("height", "width"):
                value = getattr(model, key)
                if not isinstance(value, int) or value % SPATIAL_DOWNSAMPLE:
                    fail(f"model.{key}", value, f"must be a multiple of {SPATIAL_DOWNSAMPLE} (the VAE's downsampling)")
        self.architecture(model)
        self.precision(model)

    @staticmethod
    def architecture(model: Any) -> Any:
        return architecture(model)

    @staticmethod
    def precision(model: Any) -> Any:
        return precision(model)

    def check_generation(self, model: Any, generation: Any, prompts: list[str]) -> None:
        super().check_generation(model, generation, prompts)
        wp = generation.worldplay
        ignored = [scene["prompt"] for scene in wp.scenes or () if scene["prompt"] not in prompts]
        if ignored:  # a typo'd prompt: its scene would be ignored, its run id new
            fail("generation.worldplay.scenes", ignored[0], f"every scene's prompt must be one of eval.prompts "
                 f"({len(prompts)} prompt(s), e.g. {prompts[0]!r}): a scene of another prompt is never used")
        from jensenkv.models.worldplay.schedule import NUM_TRAIN_TIMESTEPS

        if wp.stabilization_level > NUM_TRAIN_TIMESTEPS:
            fail("generation.worldplay.stabilization_level", wp.stabilization_level,
                 f"the context pass runs at timestep stabilization_level - 1, which must lie in WorldPlay's "
                 f"0..{NUM_TRAIN_TIMESTEPS - 1} schedule: use 1..{NUM_TRAIN_TIMESTEPS}")
        frames = video_frames(generation)
        if generation.frames_per_chunk < 3:
            fail("generation.frames_per_chunk", generation.frames_per_chunk,
                 "HY-WorldPlay needs chunks of at least 3 latent frames (retrieval scores frames h and h + 2; "
                 "WorldPlay uses 4)")
        if wp.memory_frames > frames:
            fail("generation.worldplay.memory_frames", wp.memory_frames,
                 f"it must be <= the {frames} latent frames generated (generation.num_chunks x frames_per_chunk)")
        if generation.sampler != "euler":
            fail("generation.sampler", generation.sampler, "HY-WorldPlay samples with Euler steps: use euler")
        if generation.window_size != 1 or generation.kv_range is not None or generation.commit_kv_range is not None:
            fail("generation.window_size / kv_range / commit_kv_range",
                 (generation.window_size, generation.kv_range, generation.commit_kv_range),
                 "HY-WorldPlay denoises one chunk at a time over its selected memory: use 1 / null / null")
        from jensenkv.models.worldplay.trajectory import load_trajectory

        for _, trajectory in self._inputs(wp, None):
            if not trajectory.endswith(".json"):  # presets and pose strings are values: checked here (files: resolve)
                load_trajectory(trajectory, frames)

    @staticmethod
    def _inputs(wp: Any, prompts: list[str] | None) -> list[tuple[Optional[str], str]]:
        """(image, trajectory) of each prompt (None: the defaults and every scene)."""
        if prompts is not None:
            return [wp.inputs(p) for p in prompts]
        pairs = [(wp.image, wp.trajectory)]
        pairs += [wp.inputs(scene["prompt"]) for scene in wp.scenes or ()]
        return pairs

    def terms(self, model: Any) -> list[str]:
        """The licence for the official weights; the tiny preset's seeded random weights are not Tencent's."""
        return [] if model.preset == "tiny" else super().terms(model)

    def model_label(self, model: Any, generation: Any) -> str:
        """name+memory mode (e.g. worldplay_8b_distilled+append): the two modes are Table 1's two row groups."""
        return f"{model.name}+{worldplay_settings(generation).memory}"

    def check_inputs(self, model: Any, generation: Any, prompts: list[str]) -> None:
        """Every prompt's first frame (exists, model.height x model.width; required by the 8B models) and pose
        file (readable, long enough, invertible cameras), before any model loads."""
        from jensenkv.models.worldplay.trajectory import load_trajectory
        from jensenkv.models.worldplay.vae import read_image

        wp = worldplay_settings(generation)
        size = pixel_size(model)
        for image, trajectory in self._inputs(wp, list(prompts)):
            if trajectory.endswith(".json"):
                load_trajectory(trajectory, video_frames(generation))
            if image is None:
                if model.preset != "tiny":
                    fail("generation.worldplay.image", None,
                         f"preset {model.preset} is image-to-video: give a first frame of {size[0]} x {size[1]} pixels "
                         "(or a scene per prompt: eval=worldplay)")
                continue
            read_image(image, size)

    # --- what needs files --------------------------------------------------------------------------------
    def input_digests(self, model: Any, generation: Any, prompts: list[str]) -> dict[str, str | None] | None:
        """Per prompt: the content digests of its first frame and pose file (None when it has neither, e.g.
        the tiny preset's seeded image and a preset trajectory; an absent file digests as None, and
        ``check_inputs`` names it)."""
        wp = worldplay_settings(generation)
        digests: dict[str, str | None] = {}
        for prompt in prompts:
            image, trajectory = wp.inputs(prompt)
            files = [Path(str(image)).expanduser() if image is not None else None,
                     Path(trajectory).expanduser() if trajectory.endswith(".json") else None]
            parts = [file_digest(f) if f is not None else None for f in files]
            digests[prompt] = None if files == [None, None] else "/".join(str(p) for p in parts)
        return digests

    def geometry(self, model: Any, generation: Any) -> Geometry | None:
        try:
            cfg = self.architecture(model)
            if model.preset == "tiny":
                height, width = int(model.latent_height or 8), int(model.latent_width or model.latent_height or 8)
            else:
                height, width = model.height // SPATIAL_DOWNSAMPLE, model.width // SPATIAL_DOWNSAMPLE
            _, ph, pw = cfg.patch_size
            return Geometry(head_dim=cfg.head_dim, heads=cfg.num_heads, kv_heads=cfg.num_heads, layers=cfg.num_layers,
                            tokens_per_chunk=generation.frames_per_chunk * (height // ph) * (width // pw))
        except (KeyError, ValueError, TypeError):
            return None

    @staticmethod
    def _variant(model: Any) -> str:
        return model.variant or PRESET_VARIANTS.get(model.preset, "?")

    def files(self, model: Any) -> list[tuple[Path, bool]]:
        """The transformer checkpoint folder, and each HunyuanVideo-1.5 part (VAE, Qwen2.5-VL text encoder and
        tokenizer, Glyph ByT5 and tokenizer, SigLIP image encoder and its preprocessor)."""
        looked: list[tuple[Path, bool]] = []
        if model.preset == "tiny":
            return looked
        root = cached_model_dir(model, looked)
        if root is not None:
            from jensenkv.models.worldplay.checkpoint import WEIGHT_FILES  # the names the loader tries, in order

            folder = root / self._variant(model)
            candidates = [folder / n for name in WEIGHT_FILES for n in (name, f"{name}.index.json")]
            found = next((p for p in candidates if p.is_file()), None)
            looked.append((found or candidates[0], found is not None))
        hunyuan = cached_model_dir(_HunyuanView(model), looked)
        for part, first in HUNYUAN_PARTS.items():
            base = Path(model.vae_path).expanduser() if part == "vae" and model.vae_path else \
                (hunyuan / part if hunyuan is not None else None)
            if base is not None:
                looked.append((base / first, (base / first).is_file()))
        return looked

    def check_weights(self, model: Any) -> None:
        missing = [path for path, ok in self.files(model) if not ok]
        if missing:
            raise FileNotFoundError(f"HY-WorldPlay file not found: {missing[0]} (model {model.name}; "
                                    f"{len(missing)} missing in all: `make check-weights` lists them); run "
                                    "`make fetch-weights` on a machine with internet (docs/WORLDPLAY.md)")

    def downloads(self, name: str, model: Any) -> list[Download]:
        """The preset's checkpoint folder of tencent/HY-WorldPlay and the HunyuanVideo-1.5 parts it reads."""
        from huggingface_hub import constants

        if model.preset not in PRESET_VARIANTS:
            return []
        cache = Path(model.cache_dir or constants.HF_HUB_CACHE).expanduser()
        items = []
        if not Path(str(model.path)).expanduser().is_dir():
            items.append(Download(f"model {name} transformer", cache, str(model.path), "hf-snapshot",
                                  (f"{self._variant(model)}/*",)))
        if not Path(str(model.hunyuan_path)).expanduser().is_dir():
            parts = tuple(f"{p}/*" for p in HUNYUAN_PARTS if not (p == "vae" and model.vae_path))
            items.append(Download(f"model {name} VAE, text and image encoders", cache, str(model.hunyuan_path),
                                  "hf-snapshot", parts))
        return items

    def build_adapter(self, model: Any, cache: Any, attention: Any, generation: Any) -> Any:
        from jensenkv.models.worldplay.adapter import load_worldplay_adapter

        return load_worldplay_adapter(model, cache, attention, generation)


@dataclass
class _HunyuanView:
    """The model node seen with hunyuan_path as its path (``cached_model_dir`` reads path and cache_dir)."""

    model: Any

    @property
    def path(self) -> Any:
        return self.model.hunyuan_path

    @property
    def cache_dir(self) -> Any:
        return self.model.cache_dir
