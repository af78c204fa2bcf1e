"""The built-in model as a family: its weights folder, geometry (from its config.json) and adapter."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from jensenkv.checks import fail
from jensenkv.models.family import Geometry, ModelFamily, NodeResources, file_digest
from jensenkv.models.wan.family import transformer_geometry
from jensenkv.models.tiny.paths import CONFIG_FILE, WEIGHTS_DIR, WEIGHTS_FILE


# what the loader and the geometry read of config.json: section -> keys (weights.load_tiny, transformer_geometry)
CONFIG_KEYS = {"transformer": ("patch_size", "num_attention_heads", "attention_head_dim", "num_layers"),
               "text": ("vocab", "max_length", "text_dim"), "data": ("height", "width")}


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


@dataclass
class TinyNode:
    """kind "tiny": the built-in model (weights_dir: its folder; null: the packaged weights)."""

    weights_dir: Optional[str] = None  # folder of model.safetensors + config.json (null: the packaged weights)


class TinyFamily(ModelFamily):
    kind = "tiny"
    node = TinyNode
    packages = (("safetensors", "safetensors"),)
    # its ops are too small to split (README run on 2 shared cores: 128 s with torch's default of 2 threads,
    # 38 s with 1)
    threads = 1
    # generation.batch_size=auto on a CPU: INT2 + Taylor, 1 thread, 2 shared cores: 1.17 videos/s at batch 1,
    # 1.69 at 8, 1.78 at 16, 1.76 at 32 (the linear layers reach ~96 GFLOP/s per core by 16)
    cpu_batch_size = 16
    metric_limits = {}  # its videos follow the prompt grammar content recovery reads
    host_base_gb = 1.5  # python, torch, the model and the run's metrics, before its videos

    def resources(self, model: Any, video: int) -> NodeResources:
        """A CPU model: no GPU, its one thread, and its CPU batch of videos above the process's base."""
        return NodeResources(0, self.threads, math.ceil(self.host_base_gb + self.cpu_batch_size * video / 2**30))

    @staticmethod
    def folder(model: Any) -> Path:
        """model.weights_dir, or the packaged weights."""
        return Path(model.weights_dir).expanduser() if model.weights_dir else WEIGHTS_DIR

    def geometry(self, model: Any, generation: Any) -> Geometry | None:
        try:
            stored = json.loads((self.folder(model) / CONFIG_FILE).read_text())
            data = stored["data"]  # pixel space: no VAE downsampling
            return transformer_geometry(stored["transformer"], generation.frames_per_chunk, data["height"], data["width"])
        except (OSError, KeyError, ValueError, TypeError):  # unreadable or absent: check_weights reports it
            return None

    def check_weights(self, model: Any) -> None:
        """Both files there and readable, cheaply: config.json with every key the loader reads, and the
        safetensors header (a truncated, garbled or empty file fails here, not after the job started)."""
        from safetensors import safe_open

        from jensenkv.models.finite_weights import first_non_finite

        folder = self.folder(model)
        for name in (WEIGHTS_FILE, CONFIG_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"model.weights_dir={str(folder)!r}: {name} is missing there "
                                        "(`make train-tiny` writes the built-in model's weights; null uses the "
                                        "packaged ones)")
        restore = "restore it or run `make train-tiny` (null uses the packaged weights)"
        try:
            stored = json.loads((folder / CONFIG_FILE).read_text())
        except (OSError, ValueError) as e:  # not JSON, not UTF-8, unreadable
            fail("model.weights_dir", str(folder), f"its {CONFIG_FILE} ({folder / CONFIG_FILE}) cannot be read ({_one_line(e)}); {restore}")
        missing = [f"{section}.{key}" for section, keys in CONFIG_KEYS.items() for key in keys
                   if not isinstance(stored, dict) or not isinstance(stored.get(section), dict)
                   or key not in stored[section]]
        if missing:
            fail("model.weights_dir", str(folder), f"its {CONFIG_FILE} ({folder / CONFIG_FILE}) lacks {missing}; {restore}")
        try:
            with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as weights:
                bad = first_non_finite((k, weights.get_tensor(k)) for k in weights.keys())  # 4 MB, read as for its digest
        except Exception as e:  # noqa: BLE001 - SafetensorError, or a header that is not JSON
            fail("model.weights_dir", str(folder), f"its {WEIGHTS_FILE} ({folder / WEIGHTS_FILE}) cannot be read, the file is truncated, "
                 f"garbled or empty ({_one_line(e)}); {restore}")
        if bad is not None:
            fail("model.weights_dir", str(folder), f"its {WEIGHTS_FILE} ({folder / WEIGHTS_FILE}) holds NaN or inf: tensor "
                 f"{bad[0]!r} has {bad[1]} non-finite values of {bad[2]}; {restore}")

    def files(self, model: Any) -> list[tuple[Path, bool]]:
        folder = self.folder(model)
        return [(folder / f, (folder / f).is_file()) for f in (WEIGHTS_FILE, CONFIG_FILE)]

    def weights_digest(self, model: Any) -> str | None:
        """The weights file's digest, so retrained weights never reuse old runs."""
        return file_digest(self.folder(model) / WEIGHTS_FILE)

    def build_adapter(self, model: Any, cache: Any, attention: Any, generation: Any) -> Any:
        """The pixel-space model behind the Wan adapter (its transformer: SkyReels-V2 in plain torch, ``wan.dit``)."""
        import torch

        from jensenkv.models.loaders import cast_like_diffusers
        from jensenkv.models.tiny.weights import load_tiny
        from jensenkv.models.wan.adapter import WanChunkwiseAdapter
        from jensenkv.quant.config import FLOAT_DTYPES

        transformer, text_encoder, tokenizer, stored = load_tiny(self.folder(model))
        device = torch.device(model.device)
        text_encoder = text_encoder.to(device).eval()

        def encode(prompts: list[str]) -> torch.Tensor:
            return text_encoder(tokenizer(prompts).to(device))  # (B, L, text_dim)

        frame = (transformer.config.in_channels, int(stored["data"]["height"]), int(stored["data"]["width"]))
        return WanChunkwiseAdapter(cast_like_diffusers(transformer, FLOAT_DTYPES[model.dtype]).to(device), encode,
                                frame, generation, cache, attention, clean_range=(-1.0, 1.0))
