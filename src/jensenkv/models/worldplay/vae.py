"""HY-WorldPlay's first frame and latents: HunyuanVideo-1.5's VAE through diffusers
(``AutoencoderKLHunyuanVideo15``, 16x spatial, 4x temporal, 32 channels) and the tiny preset's seeded stand-in.

Image conditioning (WorldPlay's ``_prepare_cond_latents`` for i2v): the condition input is the image latent in
frame 0 and zeros after it, plus one mask channel that is 1 in frame 0; the transformer reads
[latent | condition | mask] (2 C + 1 channels) per frame. The first frame is read at exactly the model's
pixel size: WorldPlay resizes (LANCZOS) and centre-crops any image, the suite takes it as given so that the
input is a file's bytes and nothing else.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from jensenkv.checks import fail

IMAGE_KEY = "generation.worldplay.image"


def read_image(path: str | Path, size: tuple[int, int], key: str = IMAGE_KEY) -> torch.Tensor:
    """(3, H, W) float32 in [-1, 1] of an RGB image file that is exactly ``size`` = (H, W) pixels."""
    from PIL import Image, UnidentifiedImageError

    file = Path(str(path)).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{key}={str(path)!r}: the first frame {file} does not exist (the user supplies "
                                "the images: docs/WORLDPLAY.md)")
    try:
        with Image.open(file) as img:
            rgb = img.convert("RGB")
    except (UnidentifiedImageError, OSError) as e:
        fail(key, str(path), f"cannot read it as an image ({type(e).__name__})")
    if (rgb.height, rgb.width) != tuple(size):
        fail(key, str(path), f"it is {rgb.height} x {rgb.width} pixels (H x W); the model needs exactly "
                             f"{size[0]} x {size[1]} (model.height x model.width): resize or crop it first")
    data = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).reshape(rgb.height, rgb.width, 3)
    return data.permute(2, 0, 1).float() / 127.5 - 1.0  # (3, H, W)


def random_image(size: tuple[int, int], seed: int) -> torch.Tensor:
    """(3, H, W) in [-1, 1]: a smooth seeded image for the tiny model when no first frame is given."""
    gen = torch.Generator().manual_seed(seed)
    coarse = torch.rand(1, 3, 4, 4, generator=gen) * 2 - 1
    return F.interpolate(coarse, size=tuple(size), mode="bilinear", align_corners=True)[0]


def condition_latents(image_latent: torch.Tensor | None, frames: int) -> torch.Tensor:
    """(1, C + 1, frames, h, w): the image latent (1, C, 1, h, w) in frame 0 and zeros after, then the mask
    channel (1 in frame 0); no image (t2v): all zeros."""
    if image_latent is None:
        raise ValueError("condition_latents needs the image latent (1, C, 1, h, w): HY-WorldPlay is image-to-video")
    _, c, _, h, w = image_latent.shape
    cond = torch.zeros(1, c + 1, frames, h, w, dtype=image_latent.dtype, device=image_latent.device)
    cond[:, :c, 0] = image_latent[:, :, 0]
    cond[:, c, 0] = 1.0
    return cond


class TinyVae(nn.Module):
    """The tiny preset's seeded random VAE stand-in: 4x4 average pooling and a 1x1 map 3 -> C to encode, a
    1x1 map C -> 3 x 16 and a pixel shuffle to decode; one video frame per latent frame."""

    factor = 4

    def __init__(self, channels: int, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed + 2)
        self.enc = nn.Parameter(torch.randn(channels, 3, generator=gen) / 3 ** 0.5, requires_grad=False)
        self.dec = nn.Parameter(torch.randn(3 * self.factor ** 2, channels, generator=gen) / channels ** 0.5,
                                requires_grad=False)

    @torch.no_grad()
    def encode(self, image: torch.Tensor) -> torch.Tensor:
        """(3, H, W) in [-1, 1] -> (1, C, 1, H / 4, W / 4)."""
        pooled = F.avg_pool2d(image[None].to(self.enc), self.factor)  # (1, 3, h, w)
        return torch.einsum("cd,bdhw->bchw", self.enc, pooled)[:, :, None]

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """(1, C, F, h, w) -> (F, 3, 4h, 4w) in [0, 1]."""
        z = latents[0].transpose(0, 1).to(self.dec)  # (F, C, h, w)
        x = F.pixel_shuffle(torch.einsum("oc,fchw->fohw", self.dec, z), self.factor)  # (F, 3, 4h, 4w)
        return (torch.tanh(x) / 2 + 0.5).float()


class HunyuanVae:
    """HunyuanVideo-1.5's VAE (diffusers ``AutoencoderKLHunyuanVideo15``): encode the first frame, decode a
    video; latents are scaled by the config's scaling_factor as WorldPlay does."""

    def __init__(self, vae: Any):
        self.vae = vae.eval()

    @torch.no_grad()
    def encode(self, image: torch.Tensor) -> torch.Tensor:
        """(3, H, W) in [-1, 1] -> (1, 32, 1, H / 16, W / 16): the mode of the posterior x scaling_factor."""
        p = next(self.vae.parameters())
        pixels = image[None, :, None].to(p.device, p.dtype)  # (1, 3, 1, H, W)
        return self.vae.encode(pixels).latent_dist.mode().float() * self.vae.config.scaling_factor

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """(1, 32, F, h, w) -> (4 (F - 1) + 1, 3, 16 h, 16 w) in [0, 1]."""
        p = next(self.vae.parameters())
        video = self.vae.decode(latents.to(p.device, p.dtype) / self.vae.config.scaling_factor, return_dict=False)[0]
        return (video[0].float() / 2 + 0.5).clamp(0, 1).transpose(0, 1)  # (F', 3, H, W)


def load_hunyuan_vae(folder: str | Path, dtype: torch.dtype, device: torch.device) -> HunyuanVae:
    """The VAE folder (diffusers layout: config.json + diffusion_pytorch_model.safetensors); one line naming
    the missing file otherwise."""
    from diffusers import AutoencoderKLHunyuanVideo15

    from jensenkv.models.loaders import FETCH_HINT, MissingWeightsError

    folder = Path(str(folder)).expanduser()
    config = folder / "config.json"
    if not config.is_file() or not list(folder.glob("*.safetensors")):
        raise MissingWeightsError(f"HunyuanVideo-1.5 VAE not found: expected {config} and *.safetensors in {folder} "
                                  f"(model.hunyuan_path or model.vae_path); {FETCH_HINT}")
    vae = AutoencoderKLHunyuanVideo15.from_pretrained(str(folder), torch_dtype=dtype, local_files_only=True)
    return HunyuanVae(vae.to(device))
