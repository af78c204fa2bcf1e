"""Video files: H.264 mp4 in and out, and a nearest-neighbour upscaled copy for watching.

The built-in model's videos are 16 x 16 pixels, a dot in a player; each saved video therefore gets a copy
enlarged by an integer factor (256 px on the long side) in the run's ``videos_upscaled/`` folder, beside
``videos/`` and never inside it: VBench scores the whole ``videos/`` folder.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

UPSCALED_DIR = "videos_upscaled"  # a run's enlarged copies, a sibling of videos/ (what VBench scores)
LONG_SIDE = 256  # pixels on the long side of an upscaled copy (an integer factor at most this)


def upscale_factor(height: int, width: int, long_side: int = LONG_SIDE) -> int:
    """The largest integer factor that keeps the long side within ``long_side`` (1: no enlarging)."""
    return max(1, long_side // max(height, width))


def upscale(video: Any, long_side: int = LONG_SIDE) -> Any:
    """(F, C, H, W) -> (F, C, k H, k W), each pixel a k x k block (nearest neighbour, k = ``upscale_factor``)."""
    k = upscale_factor(video.shape[-2], video.shape[-1], long_side)
    return video.repeat_interleave(k, dim=-2).repeat_interleave(k, dim=-1) if k > 1 else video


def save_mp4(video_u8: Any, path: Path, fps: int, tmp_dir: Path | None = None) -> Path:
    """(F, C, H, W) uint8 -> H.264 mp4, encoded to a temp file in ``tmp_dir`` (default: next to ``path``; a
    run uses its .tmp/ folder, outside videos/, which VBench scores whole) and moved into place (os.replace)."""
    frames = video_u8.permute(0, 2, 3, 1).contiguous().numpy()  # (F, H, W, C)
    if frames.shape[-1] == 1:
        frames = frames.repeat(3, axis=-1)
    even = frames.shape[1] % 2 == 0 and frames.shape[2] % 2 == 0  # yuv420p needs even sides
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = path.parent if tmp_dir is None else Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f".{path.stem}.{os.getpid()}.tmp.mp4"
    try:
        encode_h264(frames, tmp, fps, "yuv420p" if even else "yuv444p")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def encode_h264(frames: Any, path: Path, fps: float, pixel_format: str) -> None:
    """(F, H, W, 3) uint8 frames -> an H.264 mp4 at ``path``, by the ffmpeg binary imageio-ffmpeg ships: the file
    imageio.mimwrite(path, frames, fps=fps, codec="libx264", quality=9, macro_block_size=1, pixelformat=...)
    writes, byte for byte (tests/eval/test_video_files.py). Called directly because imageio starts ffmpeg with a
    ``preexec_fn``, which forces a full fork of this process: about 0.08 s of CPU per video from a run's worker
    (1.7 GB resident), against 0.02 s through vfork; ``start_new_session`` keeps a Ctrl-C meant for the run
    from reaching ffmpeg, as imageio's own process group does."""
    import subprocess
    from fractions import Fraction

    from imageio_ffmpeg import get_ffmpeg_exe

    _, height, width, channels = frames.shape
    if channels != 3:
        raise ValueError(f"frames with {channels} channels are not allowed: expected RGB (F, H, W, 3)")
    rate = str(Fraction(fps).limit_denominator())  # a rational, as imageio-ffmpeg passes it
    cmd = [get_ffmpeg_exe(), "-y", "-f", "rawvideo", "-vcodec", "rawvideo", "-s", f"{width}x{height}",
           "-pix_fmt", "rgb24", "-r", rate, "-i", "-",  # rgb24 frames in on stdin
           "-an", "-vcodec", "libx264", "-pix_fmt", pixel_format, "-crf", "5",  # H.264, CRF 5: near lossless
           "-v", "error", str(path)]
    done = subprocess.run(cmd, input=frames.tobytes(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          start_new_session=True)
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        raise OSError(f"ffmpeg could not write {path} (exit {done.returncode}): {last[0]}")


def save_upscaled(video_u8: Any, video_path: Path, fps: int, tmp_dir: Path | None = None) -> Path | None:
    """Save the upscaled copy of a video saved at ``video_path`` (``<run>/videos/<name>.mp4``) as
    ``<run>/videos_upscaled/<name>.mp4``; None when the video is already large (factor 1)."""
    if upscale_factor(video_u8.shape[-2], video_u8.shape[-1]) == 1:
        return None
    return save_mp4(upscale(video_u8), upscaled_path(video_path), fps, tmp_dir)


def upscaled_path(video_path: Path) -> Path:
    """Where the upscaled copy of ``<run>/videos/<name>.mp4`` goes: ``<run>/videos_upscaled/<name>.mp4``."""
    return video_path.parent.parent / UPSCALED_DIR / video_path.name


def load_mp4(path: Path) -> Any:
    """An mp4 as a (F, C, H, W) uint8 tensor."""
    import imageio.v2 as imageio
    import numpy as np
    import torch

    frames = np.stack(imageio.mimread(path, memtest=False))  # (F, H, W, C)
    return torch.from_numpy(frames[..., :3]).permute(0, 3, 1, 2).contiguous()


def mp4_fps(path: Path) -> float:
    """The frame rate an mp4 was saved with."""
    import imageio.v2 as imageio

    with imageio.get_reader(path) as reader:
        return float(reader.get_meta_data()["fps"])
