"""Fidelity of a quantized video to its BF16 reference: PSNR, SSIM (torchmetrics) and LPIPS (lpips).

Videos are (F, C, H, W) float in [0, 1] (or uint8). PSNR is computed from the MSE over the whole video (one
number per video), SSIM is the mean over frames; both run on the model's device in batches of frames.
LPIPS needs a torchvision backbone file that this suite never downloads: ``lpips_availability`` checks for
it BEFORE anything is constructed, and a missing file is reported as a missing metric with the file name
and where to put it (``make fetch-weights`` fetches it); a file whose SHA256 matches neither the hash in its
name nor the weights manifest is refused the same way (``jensenkv.eval.checksums``).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

# torchvision backbone checkpoints the lpips package loads (pretrained=True) for each network.
LPIPS_BACKBONE_FILES = {
    "alex": "alexnet-owt-7be5be79.pth",
    "vgg": "vgg16-397923af.pth",
    "squeeze": "squeezenet1_1-b8a52dc0.pth",
}
LPIPS_MIN_SIZE = 64  # AlexNet's strided stem collapses smaller frames to nothing; upsample to this side


class MissingWeightsError(FileNotFoundError):
    """A metric's pretrained weights are not on this machine (never downloaded at run time)."""


def _check_videos(video: torch.Tensor, reference: torch.Tensor) -> None:
    if video.dim() != 4 or video.shape[1] not in (1, 3):
        raise ValueError(f"video shape={tuple(video.shape)} is not allowed: expected (F, C, H, W) with C in (1, 3)")
    if video.shape != reference.shape:
        raise ValueError(f"video shape={tuple(video.shape)} does not match reference shape={tuple(reference.shape)}")


# Frames per batch for PSNR / SSIM: 16 frames of 544 x 960 x 3 in float32 are ~100 MB per video.
BATCH_FRAMES = 16


def _metric_device(device: str | torch.device | None) -> torch.device:
    """Where PSNR / SSIM run: the given device (the model's), else CUDA when available, else the CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _frame_batches(video: torch.Tensor, reference: torch.Tensor, device: torch.device, batch_frames: int):
    """(x, y) float32 batches of (f, C, H, W) in [0, 1] on ``device``; uint8 input is scaled by 1/255 there."""
    if isinstance(batch_frames, bool) or not isinstance(batch_frames, int) or batch_frames < 1:
        raise ValueError(f"batch_frames={batch_frames!r} is not allowed: it must be an integer >= 1")
    for start in range(0, video.shape[0], batch_frames):
        pair = []
        for v in (video, reference):
            chunk = v[start : start + batch_frames].to(device, non_blocking=True)  # (f, C, H, W)
            pair.append(chunk.float() / 255 if chunk.dtype == torch.uint8 else chunk.float())
        yield pair


def video_psnr(video: torch.Tensor, reference: torch.Tensor, device: str | torch.device | None = None,
               batch_frames: int = BATCH_FRAMES) -> float:
    """PSNR in dB over the whole video (data range 1): 10 log10(1 / MSE); inf when the videos are identical.

    video, reference: (F, C, H, W) float in [0, 1] or uint8 (then divided by 255). Computed on ``device``
    (default: CUDA when available) in float32 batches of frames; per-batch squared-error sums are
    accumulated in float64 there and read back once.
    """
    _check_videos(video, reference)
    dev = _metric_device(device)
    total = torch.zeros((), dtype=torch.float64, device=dev)
    for x, y in _frame_batches(video, reference, dev, batch_frames):
        total += (x - y).square().sum(dtype=torch.float64)
    mse = total.item() / video.numel()
    return math.inf if mse == 0 else 10.0 * math.log10(1.0 / mse)


def _ssim_kernel(height: int, width: int) -> int:
    """The usual 11 x 11 Gaussian window, shrunk (odd) for frames smaller than that."""
    side = min(11, height, width)
    return side if side % 2 else side - 1


def video_ssim(video: torch.Tensor, reference: torch.Tensor, device: str | torch.device | None = None,
               batch_frames: int = BATCH_FRAMES) -> float:
    """Mean SSIM over frames (torchmetrics' per-frame SSIM). video, reference: (F, C, H, W) in [0, 1] or uint8.

    Computed on ``device`` (default: CUDA when available) in float32 batches of frames.
    """
    from torchmetrics.functional.image import structural_similarity_index_measure

    _check_videos(video, reference)
    kernel = _ssim_kernel(video.shape[-2], video.shape[-1])
    if kernel < 3:
        raise ValueError(f"frame size {tuple(video.shape[-2:])} is too small for SSIM (needs >= 3 x 3)")
    dev = _metric_device(device)
    total = torch.zeros((), dtype=torch.float64, device=dev)
    for x, y in _frame_batches(video, reference, dev, batch_frames):
        per_frame = structural_similarity_index_measure(x, y, data_range=1.0, kernel_size=kernel,
                                                        reduction="none")  # (f,)
        total += per_frame.sum(dtype=torch.float64)
    return total.item() / video.shape[0]


@dataclass(frozen=True)
class Availability:
    """Whether a metric can run here, and why not."""

    available: bool
    reason: str | None = None  # None when available


def lpips_backbone_path(net: str = "alex") -> Path:
    """Where torchvision (hence lpips) looks for the backbone: $TORCH_HOME/hub/checkpoints/<file>."""
    if net not in LPIPS_BACKBONE_FILES:
        raise ValueError(f"eval.lpips.net={net!r} is not allowed: use one of {tuple(LPIPS_BACKBONE_FILES)}")
    return Path(torch.hub.get_dir()) / "checkpoints" / LPIPS_BACKBONE_FILES[net]


def lpips_availability(net: str = "alex") -> Availability:
    """Check for the backbone file without constructing anything (so nothing can trigger a download)."""
    from jensenkv.eval.checksums import untrusted_reason

    path = lpips_backbone_path(net)
    if path.is_file():  # torchvision unpickles it (torch.hub.load_state_dict_from_url): its name's hash must match
        reason = untrusted_reason(path)
        return Availability(reason is None, reason)
    return Availability(False, f"LPIPS backbone weights {path.name} not found: put the file in {path.parent} "
                               f"($TORCH_HOME/hub/checkpoints) or run `make fetch-weights` on a machine with internet")


class LpipsScorer:
    """LPIPS distance with the lpips package (linear heads v0.1 over a pretrained torchvision backbone)."""

    def __init__(self, net: str = "alex", device: str | torch.device = "cpu", min_size: int = LPIPS_MIN_SIZE):
        status = lpips_availability(net)
        if not status.available:
            raise MissingWeightsError(status.reason)
        import lpips

        self.net = net
        self.device = torch.device(device)
        self.min_size = min_size
        with warnings.catch_warnings():  # lpips calls torchvision's deprecated pretrained=True; nothing to act on
            warnings.simplefilter("ignore", UserWarning)
            self.model = lpips.LPIPS(net=net, verbose=False).to(self.device).eval()

    @torch.no_grad()
    def __call__(self, video: torch.Tensor, reference: torch.Tensor) -> float:
        """Mean LPIPS over frames. video, reference: (F, C, H, W) in [0, 1]."""
        _check_videos(video, reference)
        x, y = video.float().to(self.device), reference.float().to(self.device)  # (F, C, H, W)
        if x.shape[1] == 1:
            x, y = x.expand(-1, 3, -1, -1), y.expand(-1, 3, -1, -1)
        short = min(x.shape[-2:])
        if short < self.min_size:  # small frames: upsample both the same way (LPIPS needs spatial extent)
            size = [round(s * self.min_size / short) for s in x.shape[-2:]]
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
            y = F.interpolate(y, size=size, mode="bilinear", align_corners=False)
        dist = self.model(x * 2 - 1, y * 2 - 1)  # lpips takes [-1, 1]; (F, 1, 1, 1)
        return float(dist.mean())
