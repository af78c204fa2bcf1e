"""HY-WorldPlay's conditioning streams: the prompt through Qwen2.5-VL-7B (1000 tokens) and Glyph ByT5 (256
tokens of quoted text), and the first frame through SigLIP (729 image tokens), HunyuanVideo-1.5's encoders
loaded with transformers and encoded by diffusers' HunyuanVideo-1.5 I2V pipeline code; and the tiny
preset's seeded stand-ins. The transformer concatenates them into one text stream, drops the padding and
caches its K/V once per prompt (part of ``jensenkv.models.worldplay.model``).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

QWEN_MAX_TOKENS = 1000
BYT5_MAX_TOKENS = 256
VISION_TOKENS = 729


@dataclass
class PromptStates:
    """One prompt and first frame, encoded; masks are 1 on valid tokens (padding is dropped by the model)."""

    text: torch.Tensor         # (1, L, text_states_dim) Qwen2.5-VL hidden states (2 layers from the top)
    text_mask: torch.Tensor    # (1, L) int64
    byt5: torch.Tensor         # (1, L2, byt5_states_dim) Glyph ByT5 states of the quoted text (zeros if none)
    byt5_mask: torch.Tensor    # (1, L2) int64
    vision: torch.Tensor       # (1, 729, vision_states_dim) SigLIP tokens of the first frame


def _missing(what: str, path: Path) -> Exception:
    from jensenkv.models.loaders import FETCH_HINT, MissingWeightsError

    return MissingWeightsError(f"HunyuanVideo-1.5 {what} not found: expected {path} (model.hunyuan_path); {FETCH_HINT}")


def _require(folder: Path, first: str, what: str) -> Path:
    if not (folder / first).is_file():
        raise _missing(what, folder / first)
    return folder


class HunyuanPromptEncoder:
    """Qwen2.5-VL-7B + Glyph ByT5 + SigLIP of a HunyuanVideo-1.5 I2V folder in diffusers' layout (text_encoder/,
    tokenizer/, text_encoder_2/, tokenizer_2/, image_encoder/, feature_extractor/)."""

    def __init__(self, root: str | Path, dtype: torch.dtype, device: torch.device):
        from transformers import (
            AutoTokenizer,
            Qwen2_5_VLTextModel,
            SiglipImageProcessor,
            SiglipVisionModel,
            T5EncoderModel,
        )

        root = Path(str(root)).expanduser()
        load = {"local_files_only": True}
        self.tokenizer = AutoTokenizer.from_pretrained(
            str(_require(root / "tokenizer", "tokenizer_config.json", "Qwen2.5-VL tokenizer")), **load)
        self.text_encoder = Qwen2_5_VLTextModel.from_pretrained(
            str(_require(root / "text_encoder", "config.json", "Qwen2.5-VL-7B text encoder")), torch_dtype=dtype,
            **load).to(device).eval()
        self.tokenizer_2 = AutoTokenizer.from_pretrained(
            str(_require(root / "tokenizer_2", "tokenizer_config.json", "ByT5 tokenizer")), **load)
        self.text_encoder_2 = T5EncoderModel.from_pretrained(
            str(_require(root / "text_encoder_2", "config.json", "Glyph ByT5 encoder")), torch_dtype=dtype,
            **load).to(device).eval()
        self.feature_extractor = SiglipImageProcessor.from_pretrained(
            str(_require(root / "feature_extractor", "preprocessor_config.json", "SigLIP preprocessor")), **load)
        self.image_encoder = SiglipVisionModel.from_pretrained(
            str(_require(root / "image_encoder", "config.json", "SigLIP image encoder")), torch_dtype=dtype,
            **load).to(device).eval()
        self.device = torch.device(device)

    @torch.no_grad()
    def __call__(self, prompt: str, image: torch.Tensor) -> PromptStates:
        """image: (3, H, W) in [-1, 1]."""
        from diffusers import HunyuanVideo15ImageToVideoPipeline as Pipe
        from PIL import Image

        text, text_mask = Pipe._get_mllm_prompt_embeds(text_encoder=self.text_encoder, tokenizer=self.tokenizer,
                                                       prompt=[prompt], device=self.device,
                                                       tokenizer_max_length=QWEN_MAX_TOKENS)
        byt5, byt5_mask = Pipe._get_byt5_prompt_embeds(tokenizer=self.tokenizer_2, text_encoder=self.text_encoder_2,
                                                       prompt=[prompt], device=self.device,
                                                       tokenizer_max_length=BYT5_MAX_TOKENS)
        pixels = ((image.permute(1, 2, 0) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).cpu().numpy()
        vision = Pipe._get_image_embeds(self.image_encoder, self.feature_extractor, Image.fromarray(pixels),
                                        self.device)
        return PromptStates(text.float(), text_mask.long(), byt5.float(), byt5_mask.long(), vision.float())


class TinyPromptEncoder(nn.Module):
    """The tiny preset's seeded stand-ins: each word maps to a fixed random vector (text), each quoted byte to
    one (ByT5), and the image's 4 x 4 average-pooled colours through a fixed random map (vision tokens)."""

    def __init__(self, text_dim: int, byt5_dim: int, vision_dim: int, vocab: int = 512, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed + 3)
        self.words = nn.Parameter(torch.randn(vocab, text_dim, generator=gen), requires_grad=False)
        self.bytes = nn.Parameter(torch.randn(256, byt5_dim, generator=gen), requires_grad=False)
        self.colours = nn.Parameter(torch.randn(vision_dim, 3, generator=gen), requires_grad=False)
        self.vocab = vocab

    def word_ids(self, prompt: str) -> list[int]:
        words = prompt.lower().split() or [""]
        return [int(hashlib.sha256(w.encode()).hexdigest(), 16) % self.vocab for w in words]

    @torch.no_grad()
    def forward(self, prompt: str, image: torch.Tensor) -> PromptStates:
        ids = torch.tensor(self.word_ids(prompt), device=self.words.device)
        text = self.words[ids][None]  # (1, L, text_dim)
        quoted = "".join(prompt.split('"')[1::2]).encode()[:BYT5_MAX_TOKENS] or b"\0"
        byt5 = self.bytes[torch.tensor(list(quoted), device=self.bytes.device)][None]  # (1, L2, byt5_dim)
        byt5_mask = torch.full((1, byt5.shape[1]), int(bool(prompt.count('"') >= 2)), dtype=torch.int64)
        pooled = torch.nn.functional.adaptive_avg_pool2d(image[None].to(self.colours), 4)  # (1, 3, 4, 4)
        vision = torch.einsum("vc,bchw->bhwv", self.colours, pooled).reshape(1, 16, -1)  # (1, 16, vision_dim)
        return PromptStates(text, torch.ones(text.shape[:2], dtype=torch.int64), byt5, byt5_mask, vision)


def load_prompt_encoder(root: Any, dtype: torch.dtype, device: torch.device) -> HunyuanPromptEncoder:
    """The real encoders of ``model.hunyuan_path`` (a folder in diffusers' layout)."""
    return HunyuanPromptEncoder(root, dtype, device)
