"""The mp4 writer: byte for byte the file imageio writes with the suite's settings, a round trip through the decoder,
ffmpeg in its own session (a Ctrl-C for the run does not reach it), and a failure as one line."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import imageio.v2 as imageio
import pytest
import torch

from jensenkv.eval.video_files import encode_h264, load_mp4, save_mp4, save_upscaled, upscaled_path


def imageio_file(video: torch.Tensor, path: Path, fps: float) -> bytes:
    """What save_mp4 wrote through imageio until it called ffmpeg itself (the same settings)."""
    frames = video.permute(0, 2, 3, 1).contiguous().numpy()
    even = frames.shape[1] % 2 == 0 and frames.shape[2] % 2 == 0
    imageio.mimwrite(path, list(frames), fps=fps, codec="libx264", quality=9, macro_block_size=1,
                     ffmpeg_log_level="error", pixelformat="yuv420p" if even else "yuv444p")
    return path.read_bytes()


@pytest.mark.parametrize("frames, height, width, fps", [(8, 16, 16, 8), (1, 16, 16, 24), (5, 15, 17, 16),
                                                        (8, 256, 256, 8), (3, 32, 48, 7.5), (2, 24, 24, 30000 / 1001)])
def test_the_file_is_imageios_byte_for_byte(tmp_path, frames, height, width, fps):
    video = (torch.rand(frames, 3, height, width, generator=torch.Generator().manual_seed(frames)) * 255).to(torch.uint8)
    ours = save_mp4(video, tmp_path / "ours.mp4", fps).read_bytes()
    assert ours == imageio_file(video, tmp_path / "imageio.mp4", fps)


def test_a_flat_video_round_trips_closely(tmp_path):
    colours = torch.tensor([[200, 30, 30], [30, 200, 30], [30, 30, 200], [120, 120, 120]], dtype=torch.uint8)
    video = colours[:, :, None, None].expand(4, 3, 16, 16).contiguous()  # (F, 3, 16, 16): one colour a frame
    back = load_mp4(save_mp4(video, tmp_path / "flat.mp4", 8))  # (F, C, H, W) uint8, CRF 5: near lossless
    assert back.shape == video.shape and (back.float() - video.float()).abs().max() <= 3


def test_the_upscaled_copy_and_a_grey_video(tmp_path):
    grey = (torch.rand(4, 1, 16, 16, generator=torch.Generator().manual_seed(3)) * 255).to(torch.uint8)
    saved = save_mp4(grey, tmp_path / "videos" / "0000_s0.mp4", 8)
    assert load_mp4(saved).shape == (4, 3, 16, 16)
    big = save_upscaled(grey, saved, 8)
    assert big == upscaled_path(saved) and load_mp4(big).shape == (4, 3, 256, 256)
    assert sorted(p.name for p in (tmp_path / "videos").iterdir()) == ["0000_s0.mp4"]  # no temp file left


def test_ffmpeg_runs_in_its_own_session(tmp_path, monkeypatch):
    seen = {}
    run = subprocess.run

    def spy(cmd, *args, **kwargs):
        seen.update(kwargs)
        return run(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)
    save_mp4(torch.zeros(2, 3, 16, 16, dtype=torch.uint8), tmp_path / "a.mp4", 8)
    assert seen["start_new_session"] is True and "preexec_fn" not in seen  # vfork-able: no Python in the child


def test_a_failure_is_one_line_and_leaves_no_file(tmp_path):
    frames = torch.zeros(2, 16, 16, 3, dtype=torch.uint8).numpy()
    target = tmp_path / "missing-folder" / "a.mp4"  # ffmpeg cannot open it
    with pytest.raises(OSError, match=r"^ffmpeg could not write .*a\.mp4 \(exit \d+\): ") as err:
        encode_h264(frames, target, 8, "yuv420p")
    assert "\n" not in str(err.value) and not target.exists()
    with pytest.raises(ValueError, match="frames with 4 channels are not allowed"):
        encode_h264(torch.zeros(2, 16, 16, 4, dtype=torch.uint8).numpy(), tmp_path / "b.mp4", 8, "yuv420p")
    assert os.listdir(tmp_path) == []  # nothing written
