"""SkyReels-V2 / Wan2.1 / Self-Forcing through diffusers as a family: a diffusers folder (local, or a Hub id
already in the Hugging Face cache), optionally an original-format transformer checkpoint."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Optional

from jensenkv.checks import check_choice, check_int, fail
from jensenkv.models.family import CheckpointNode, Download, Geometry, ModelFamily, cached_model_dir, local_model_dir
from jensenkv.models.wan.fps import FPS_EMBEDDING_IDS
from jensenkv.models.wan.names import TRANSFORMER_CLASS_NAMES

VAE_SCALE = 8  # Wan VAE: 8x spatial downsampling
# Original-format checkpoints named by model.transformer_checkpoint: file name -> (Hub repo, file in repo).
CHECKPOINT_SOURCES = {"self_forcing_dmd.pt": ("gdhe17/Self-Forcing", "checkpoints/self_forcing_dmd.pt")}


def transformer_geometry(transformer: Mapping[str, Any], frames_per_chunk: int, height: int, width: int) -> Geometry:
    """The geometry of a diffusers Wan / SkyReels-V2 transformer config (its config.json) on latent frames of
    height x width (the built-in model's transformer too: its frames are pixels)."""
    _, p_h, p_w = transformer["patch_size"]
    heads = int(transformer["num_attention_heads"])
    return Geometry(head_dim=int(transformer["attention_head_dim"]), heads=heads, kv_heads=heads,
                    layers=int(transformer["num_layers"]),
                    tokens_per_chunk=frames_per_chunk * (int(height) // p_h) * (int(width) // p_w))


@dataclass
class WanNode(CheckpointNode):
    """kind "diffusers": a SkyReels-V2 / Wan checkpoint in diffusers layout at ``path`` (a local folder or a Hub
    id already in the Hugging Face cache; never downloaded at run time); ``transformer_checkpoint``
    optionally replaces the transformer weights with an original-format Wan state dict."""

    transformer_class: Optional[str] = None  # SkyReelsV2Transformer3DModel | WanTransformer3DModel
    max_sequence_length: Optional[int] = None   # T5 prompt tokens (null: 512)
    transformer_subfolder: Optional[str] = None  # the transformer's folder inside path (null: transformer)
    transformer_checkpoint: Optional[str] = None  # an original-format Wan state dict replacing its weights
    checkpoint_key: Optional[str] = None   # the state dict inside transformer_checkpoint (e.g. generator_ema)


class WanFamily(ModelFamily):
    kind = "diffusers"
    node = WanNode
    packages = (("diffusers", "diffusers"), ("transformers", "transformers"))

    def check(self, model: Any) -> None:
        CheckpointNode.check(model)
        for key in ("transformer_class", "path", "height", "width"):
            if getattr(model, key) is None:
                fail(f"model.{key}", None, "kind=diffusers needs transformer_class, path, height and width")
        check_choice("model.transformer_class", model.transformer_class, TRANSFORMER_CLASS_NAMES)
        for key in ("height", "width"):
            check_int(f"model.{key}", getattr(model, key), 8)
        check_int("model.max_sequence_length", model.max_sequence_length, 1, optional=True)
        if model.fps is not None:
            check_choice("model.fps", model.fps, tuple(FPS_EMBEDDING_IDS))

    def geometry(self, model: Any, generation: Any) -> Geometry | None:
        local = local_model_dir(model.path, model.cache_dir)
        if local is None:
            return None
        try:
            sub = local / (model.transformer_subfolder or "transformer")
            transformer = json.loads((sub / "config.json").read_text())
            return transformer_geometry(transformer, generation.frames_per_chunk, int(model.height) // VAE_SCALE,
                                        int(model.width) // VAE_SCALE)
        except (OSError, KeyError, ValueError, TypeError):  # unreadable: check_weights reports it
            return None

    def check_weights(self, model: Any) -> None:
        folder = local_model_dir(model.path, model.cache_dir)
        if folder is None:
            raise FileNotFoundError(f"model.path={model.path!r} is neither a local folder nor in the Hugging Face "
                                    f"cache ({model.cache_dir or 'HF_HUB_CACHE'}); run `make fetch-weights` on a "
                                    "machine with internet, or point model.path at a local copy")
        sub = folder / (model.transformer_subfolder or "transformer") / "config.json"
        if not sub.is_file():
            raise FileNotFoundError(f"model.path={model.path!r}: {sub} is missing")
        if model.transformer_checkpoint and not Path(model.transformer_checkpoint).is_file():
            raise FileNotFoundError(f"model.transformer_checkpoint={model.transformer_checkpoint!r} does not exist "
                                    "(`make fetch-weights` downloads it)")

    def files(self, model: Any) -> list[tuple[Path, bool]]:
        looked: list[tuple[Path, bool]] = []
        folder = cached_model_dir(model, looked)
        if folder is not None:
            sub = model.transformer_subfolder or "transformer"
            for path in (folder / sub / "config.json", folder / "vae", folder / "tokenizer", folder / "text_encoder"):
                looked.append((path, path.exists()))
        if model.transformer_checkpoint:
            ckpt = Path(str(model.transformer_checkpoint)).expanduser().resolve()
            looked.append((ckpt, ckpt.is_file()))
        return looked

    def downloads(self, name: str, model: Any) -> list[Download]:
        """The Hub snapshot (unless ``path`` is a local folder) and the original checkpoint, if one is named."""
        from huggingface_hub import constants

        items = []
        if not Path(str(model.path)).expanduser().is_dir():
            cache = Path(model.cache_dir or constants.HF_HUB_CACHE).expanduser()
            items.append(Download(f"model {name}", cache, str(model.path), "hf-snapshot"))
        if model.transformer_checkpoint:
            file = Path(model.transformer_checkpoint).expanduser()
            if file.name not in CHECKPOINT_SOURCES:
                print(f"note: no known source for {file} (model {name}); copy it there by hand", file=sys.stderr)
            else:
                repo, in_repo = CHECKPOINT_SOURCES[file.name]
                items.append(Download(f"model {name} checkpoint", file, f"{repo}::{in_repo}", "hf-file"))
        return items

    def build_adapter(self, model: Any, cache: Any, attention: Any, generation: Any) -> Any:
        from jensenkv.models.wan.build import load_diffusers_adapter

        return load_diffusers_adapter(model, cache, attention, generation)
