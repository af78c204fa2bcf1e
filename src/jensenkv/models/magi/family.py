"""MAGI-1 as a family: its presets (a seeded random tiny one, or the official 4.5B / 24B files of
sand-ai/MAGI-1), geometry from the preset, the files it reads and the adapter (docs/MAGI1.md)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from jensenkv.checks import check_choice, check_int, fail
from jensenkv.models.family import CheckpointNode, Download, Geometry, ModelFamily, cached_model_dir, local_model_dir
from jensenkv.models.magi.config import PRESET_VARIANTS, PRESETS, SPATIAL_DOWNSAMPLE, MagiModelConfig, model_preset
from jensenkv.models.magi.schedule import MagiGenerationNode

SPECIAL_TOKENS_URL = "https://raw.githubusercontent.com/SandAI-org/MAGI-1/main/example/assets/special_tokens.npz"


@dataclass
class MagiNode(CheckpointNode):
    """kind "magi": MAGI-1 (jensenkv.models.magi, docs/MAGI1.md): ``preset`` tiny (seeded random, no weights) or
    4.5B / 4.5B_distill / 24B / 24B_distill, loaded from the official files of sand-ai/MAGI-1 at ``path``."""

    preset: Optional[str] = None       # tiny | 4.5B | 4.5B_distill | 24B | 24B_distill
    variant: Optional[str] = None      # checkpoint folder under ckpt/magi/ (null: the preset's)
    t5_path: Optional[str] = None      # T5 folder (null: <path>/ckpt/t5/t5-v1_1-xxl)
    vae_path: Optional[str] = None     # ViT VAE folder (null: <path>/ckpt/vae)
    vae_latent_scale: Optional[float] = None  # latents x this before the DiT (null: 0.18215)
    special_tokens_file: Optional[str] = None  # special_tokens.npz of the MAGI-1 code repo
    special_tokens: Optional[list[str]] = None  # its tokens prepended to every caption (null: none)
    model_overrides: Optional[dict[str, Any]] = None  # MagiModelConfig fields replaced in the preset
    latent_height: Optional[int] = None  # tiny: latent frame size (real presets: height / 8)
    latent_width: Optional[int] = None  # tiny: latent frame width (null: latent_height)
    seed: Optional[int] = None         # tiny: seed of the random initialisation


class MagiFamily(ModelFamily):
    kind = "magi"
    node = MagiNode
    packages = (("transformers", "transformers"), ("safetensors", "safetensors"))
    # generation.batch_size=auto on a CPU, measured on model=magi1_tiny (INT2 RTN g32 + Taylor, 8 steps, 1 thread,
    # 2 shared cores; medians of 7 interleaved runs), videos per CPU second: 3.6 at batch 1, 5.2 at 2, 8.2 at 4,
    # 9.9 at 8, 12.0 at 16, 13.3 at 24, 13.6 at 32, 12.8 at 48 (11.1 at 64 in a 5-run sweep); a rerun on a busier
    # machine: 11.3 at 16, 12.0 at 24, 11.9 at 32, so 24-32 is the plateau
    cpu_batch_size = 32
    generation_node = MagiGenerationNode  # generation.magi: required here, refused elsewhere (check_generation)
    extra_chunks_in_flight = 1  # the finished chunk re-run at clean_t in the next tick's forward

    def check(self, model: Any) -> None:
        CheckpointNode.check(model)
        if model.preset is None:
            fail("model.preset", None, "kind=magi needs a preset: tiny, 4.5B, 4.5B_distill, 24B or 24B_distill")
        check_choice("model.preset", model.preset, tuple(PRESETS))
        self.architecture(model)
        for key in ("latent_height", "latent_width"):
            check_int(f"model.{key}", getattr(model, key), 1, optional=True)
        check_int("model.seed", model.seed, 0, optional=True)

    def check_generation(self, model: Any, generation: Any, prompts: list[str]) -> None:
        """What the adapter would refuse once loaded, and the distilled-only fields a non-distilled model would
        ignore (each would still mint a new run id): refused before launch."""
        super().check_generation(model, generation, prompts)
        if model.preset not in PRESETS:
            return  # check() names the preset
        magi, arch = generation.magi, self.architecture(model)
        if magi.null_caption_tokens > arch.caption_max_length:
            fail("generation.magi.null_caption_tokens", magi.null_caption_tokens,
                 f"the null caption of preset {model.preset} has caption_max_length={arch.caption_max_length} rows")
        if arch.distill and generation.steps == 12:
            fail("generation.steps", 12, "a distilled MAGI-1's 12-step shortcut schedule (shortcut_mode) is not "
                 "ported: use 8, 16, 32 or 64")
        changed = [] if arch.distill else magi.distill_changes()
        if changed:
            fail(f"generation.magi.{changed[0]}", getattr(magi, changed[0]),
                 f"preset {model.preset} is not distilled and never reads it: leave it at its default (only "
                 "*_distill presets use the distilled fields)")

    @staticmethod
    def architecture(model: Any) -> MagiModelConfig:
        """The preset with model.model_overrides applied (ValueError naming a field it does not have)."""
        overrides = model.model_overrides or {}
        allowed = sorted(MagiModelConfig.__dataclass_fields__)
        unknown = sorted(set(overrides) - set(allowed))
        if unknown:
            fail("model.model_overrides", dict(overrides), f"{unknown} are not MAGI-1 model fields; use {allowed}")
        return model_preset(model.preset, prefix="model.model_overrides.", **overrides)

    def geometry(self, model: Any, generation: Any) -> Geometry | None:
        try:
            magi = self.architecture(model)
            if model.latent_height:  # tiny preset: latent size given directly
                height, width = model.latent_height, model.latent_width or model.latent_height
            else:
                height, width = model.height // SPATIAL_DOWNSAMPLE, model.width // SPATIAL_DOWNSAMPLE
            patch = magi.patch_size
            return Geometry(head_dim=magi.head_dim, heads=magi.num_heads, kv_heads=magi.num_kv_heads,
                            layers=magi.num_layers,
                            tokens_per_chunk=generation.frames_per_chunk * (height // patch) * (width // patch))
        except (KeyError, ValueError, TypeError):  # no size for a real preset: its loader says what is missing
            return None

    def check_weights(self, model: Any) -> None:
        if model.preset == "tiny":  # random-initialised: no files
            return
        if local_model_dir(model.path, model.cache_dir) is None:
            raise FileNotFoundError(f"model.path={model.path!r} is neither a local folder nor in the Hugging Face "
                                    f"cache ({model.cache_dir or 'HF_HUB_CACHE'}); run `make fetch-weights` on a "
                                    "machine with internet (docs/MAGI1.md lists the files)")
        if model.special_tokens and not Path(str(model.special_tokens_file)).expanduser().is_file():
            raise FileNotFoundError(f"model.special_tokens_file={model.special_tokens_file!r} does not exist "
                                    "(`make fetch-weights` downloads special_tokens.npz)")

    def files(self, model: Any) -> list[tuple[Path, bool]]:
        looked: list[tuple[Path, bool]] = []
        if model.preset == "tiny":
            return looked
        folder = cached_model_dir(model, looked)
        variant = model.variant or PRESET_VARIANTS.get(model.preset, "?")
        if folder is not None:
            for path in (folder / "ckpt" / "magi" / variant, Path(model.t5_path or folder / "ckpt" / "t5"),
                         Path(model.vae_path or folder / "ckpt" / "vae")):
                looked.append((path, path.exists()))
        if model.special_tokens:
            tokens = Path(str(model.special_tokens_file)).expanduser()
            looked.append((tokens, tokens.is_file()))
        return looked

    def downloads(self, name: str, model: Any) -> list[Download]:
        """The variant's DiT weights, T5 and VAE of sand-ai/MAGI-1, and the code repo's special tokens."""
        from huggingface_hub import constants

        if model.preset not in PRESET_VARIANTS:  # the tiny preset needs no files
            return []
        items = []
        if not Path(str(model.path)).expanduser().is_dir():
            variant = model.variant or PRESET_VARIANTS[model.preset]
            cache = Path(model.cache_dir or constants.HF_HUB_CACHE).expanduser()
            patterns = (f"ckpt/magi/{variant}/*", f"ckpt/magi/{variant}/*/*", "ckpt/t5/*", "ckpt/t5/*/*", "ckpt/vae/*")
            items.append(Download(f"model {name}", cache, str(model.path), "hf-snapshot", patterns))
        if model.special_tokens:
            items.append(Download(f"model {name} special tokens", Path(model.special_tokens_file).expanduser(),
                                  SPECIAL_TOKENS_URL, "file"))
        return items

    def build_adapter(self, model: Any, cache: Any, attention: Any, generation: Any) -> Any:
        from jensenkv.models.magi.build import load_magi_adapter

        return load_magi_adapter(model, cache, attention, generation)
