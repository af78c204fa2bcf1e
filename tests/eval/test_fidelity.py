"""PSNR / SSIM against hand computations, and LPIPS: detected-missing backbone, never downloaded."""
from __future__ import annotations

import math

import pytest
import torch

from jensenkv.eval.fidelity import (
    LPIPS_BACKBONE_FILES,
    LpipsScorer,
    MissingWeightsError,
    lpips_availability,
    lpips_backbone_path,
    video_psnr,
    video_ssim,
)


def _video(seed: int = 0, frames: int = 4, size: int = 16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(frames, 3, size, size, generator=gen)  # (F, C, H, W) in [0, 1]


def _noisy(video: torch.Tensor, sigma: float, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (video + sigma * torch.randn(video.shape, generator=gen)).clamp(0, 1)


def test_psnr_is_ten_log10_of_inverse_mse():
    ref = _video()
    x = _noisy(ref, 0.05)
    mse = (x.double() - ref.double()).square().mean().item()
    assert video_psnr(x, ref) == pytest.approx(10 * math.log10(1 / mse), rel=1e-6)
    assert video_psnr(ref, ref) == math.inf


def test_ssim_is_one_for_identical_videos_and_falls_with_noise():
    ref = _video()
    assert video_ssim(ref, ref) == pytest.approx(1.0, abs=1e-9)
    scores = [video_ssim(_noisy(ref, s), ref) for s in (0.02, 0.1, 0.3)]
    assert scores[0] > scores[1] > scores[2] and scores[0] < 1


def test_ssim_window_shrinks_for_small_frames():
    ref = _video(size=8)
    assert 0 < video_ssim(_noisy(ref, 0.1), ref) < 1  # 7 x 7 window instead of failing on 8 x 8 frames


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="does not match reference shape"):
        video_psnr(_video(frames=4), _video(frames=3))
    with pytest.raises(ValueError, match=r"expected \(F, C, H, W\)"):
        video_ssim(torch.rand(3, 16, 16), torch.rand(3, 16, 16))


def test_missing_lpips_backbone_is_reported_with_file_and_place(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    status = lpips_availability("alex")
    assert not status.available
    assert "alexnet-owt-7be5be79.pth" in status.reason and str(tmp_path / "hub" / "checkpoints") in status.reason

    def no_download(*args, **kwargs):
        raise AssertionError("tried to download LPIPS weights")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_download)
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_download)
    with pytest.raises(MissingWeightsError, match="alexnet-owt-7be5be79.pth"):
        LpipsScorer("alex")


def test_unknown_lpips_net_is_rejected():
    with pytest.raises(ValueError, match="eval.lpips.net='resnet'"):
        lpips_backbone_path("resnet")


def _place_random_alexnet(torch_home) -> None:
    """A random AlexNet checkpoint where torchvision looks for the real one; the classifier (unused by LPIPS)
    is stored as stride-0 views so the file stays a few MB."""
    import torchvision

    torch.manual_seed(0)
    state = torchvision.models.alexnet().state_dict()
    state = {k: (v if k.startswith("features") else torch.zeros(1).expand(v.shape)) for k, v in state.items()}
    path = torch_home / "hub" / "checkpoints" / LPIPS_BACKBONE_FILES["alex"]
    path.parent.mkdir(parents=True)
    torch.save(state, path)


def test_lpips_runs_offline_once_the_backbone_is_in_place(tmp_path, monkeypatch):
    import jensenkv.eval.checksums

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    _place_random_alexnet(tmp_path)
    backbone = tmp_path / "hub" / "checkpoints" / LPIPS_BACKBONE_FILES["alex"]
    status = lpips_availability("alex")  # a random stand-in: its SHA256 is not the 7be5be79... in its name
    assert not status.available and status.reason.startswith(f"{backbone} refused before loading")
    with pytest.raises(MissingWeightsError, match="refused before loading"):
        LpipsScorer("alex")
    monkeypatch.setattr(jensenkv.eval.checksums, "untrusted_reason", lambda path: None)  # as if it were the real one
    assert lpips_availability("alex").available
    scorer = LpipsScorer("alex")  # 16 x 16 frames are upsampled to 64 so AlexNet's stem has room
    ref = _video()
    assert scorer(ref, ref) == pytest.approx(0.0, abs=1e-6)
    near, far = scorer(_noisy(ref, 0.05), ref), scorer(_noisy(ref, 0.3), ref)
    assert 0 < near < far


@pytest.mark.parametrize("batch_frames", [1, 3, 16])
def test_batched_psnr_ssim_equal_torchmetrics_on_the_whole_video(batch_frames):
    """Batches of frames in float32 give torchmetrics' float64 whole-video answers (PSNR over all pixels,
    SSIM averaged over frames)."""
    from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

    ref = _video(frames=7, size=24)
    x = _noisy(ref, 0.07)
    psnr_ref = peak_signal_noise_ratio(x.double(), ref.double(), data_range=1.0).item()
    ssim_ref = structural_similarity_index_measure(x.double(), ref.double(), data_range=1.0, kernel_size=11).item()
    assert video_psnr(x, ref, device="cpu", batch_frames=batch_frames) == pytest.approx(psnr_ref, rel=1e-6)
    assert video_ssim(x, ref, device="cpu", batch_frames=batch_frames) == pytest.approx(ssim_ref, abs=2e-6)


def test_uint8_videos_are_scaled_on_the_device_and_bad_batches_rejected():
    ref = (_video(frames=5) * 255).round().to(torch.uint8)
    x = (_noisy(_video(frames=5), 0.1) * 255).round().to(torch.uint8)
    assert video_psnr(x, ref, batch_frames=2) == pytest.approx(video_psnr(x.double() / 255, ref.double() / 255),
                                                               rel=1e-9)
    assert video_ssim(x, ref, batch_frames=2) == pytest.approx(video_ssim(x.float() / 255, ref.float() / 255),
                                                               abs=1e-7)
    with pytest.raises(ValueError, match="batch_frames=0"):
        video_psnr(x, ref, batch_frames=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_psnr_ssim_on_cuda_equal_the_cpu():
    ref = _video(frames=6, size=32)
    x = _noisy(ref, 0.05)
    assert video_psnr(x, ref, device="cuda") == pytest.approx(video_psnr(x, ref, device="cpu"), rel=1e-6)
    assert video_ssim(x, ref, device="cuda") == pytest.approx(video_ssim(x, ref, device="cpu"), abs=1e-5)
