"""HY-WorldPlay's inputs: the first frame (exact size, read as given) in frame 0 of the condition channels with
mask 1, per-prompt scenes, and every bad input (image size, missing image, short or singular pose file) as one
line naming the key before any model loads."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image

from jensenkv.models.worldplay.trajectory import poses_from_motions, write_pose_json
from jensenkv.models.worldplay.vae import TinyVae, condition_latents, read_image
from jensenkv.run import run_overrides
from jensenkv.hashing import config_hash

TINY = ("model=worldplay_tiny", "model.device=cpu", "eval.num_prompts=1", "logger=disabled", "eval.metrics=[psnr]")


def png(path, height: int, width: int, seed: int = 0):
    rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(path)
    return rgb


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a WorldPlay model is built: the bad input must be caught before."""
    import jensenkv.models.worldplay.adapter as adapter

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr(adapter, "load_worldplay_adapter", refuse)


def test_an_image_is_read_as_given_in_minus_one_to_one(tmp_path):
    rgb = png(tmp_path / "a.png", 32, 48)
    image = read_image(tmp_path / "a.png", (32, 48))
    assert image.shape == (3, 32, 48)
    assert torch.equal(image, torch.from_numpy(rgb).permute(2, 0, 1).float() / 127.5 - 1)


def test_the_image_latent_goes_in_frame_zero_with_mask_one():
    latent = torch.randn(1, 4, 1, 8, 8)
    cond = condition_latents(latent, 12)
    assert cond.shape == (1, 5, 12, 8, 8)
    assert torch.equal(cond[:, :4, 0], latent[:, :, 0]) and cond[:, :4, 1:].abs().sum() == 0
    assert torch.equal(cond[:, 4, 0], torch.ones(1, 8, 8)) and cond[:, 4, 1:].abs().sum() == 0
    vae = TinyVae(4)
    assert vae.encode(torch.zeros(3, 32, 32)).shape == (1, 4, 1, 8, 8)
    assert vae.decode(torch.zeros(1, 4, 3, 8, 8)).shape == (3, 3, 32, 32)


def test_an_image_of_the_wrong_size_is_refused_before_any_model_loads(tmp_path, no_model):
    png(tmp_path / "small.png", 30, 32)
    with pytest.raises(ValueError, match=r"^generation.worldplay.image='.*small.png' is not allowed: it is 30 x 32 "
                                         r"pixels \(H x W\); the model needs exactly 32 x 32"):
        run_overrides([*TINY, f"paths.results_dir={tmp_path}", f"generation.worldplay.image={tmp_path / 'small.png'}"])
    with pytest.raises(FileNotFoundError, match=r"generation.worldplay.image='.*absent.png': the first frame .* does "
                                                r"not exist"):
        run_overrides([*TINY, f"paths.results_dir={tmp_path}", f"generation.worldplay.image={tmp_path / 'absent.png'}"])


def test_a_short_or_singular_pose_file_is_refused_before_any_model_loads(tmp_path, no_model):
    short = write_pose_json(tmp_path / "short.json", poses_from_motions([{"forward": 0.1}] * 9))
    with pytest.raises(ValueError, match=r"generation.worldplay.trajectory='.*short.json' is not allowed: it has 10 "
                                         r"latent frames but the video has 20"):
        run_overrides([*TINY, f"paths.results_dir={tmp_path}", f"generation.worldplay.trajectory={short}"])
    c2w = poses_from_motions([{"forward": 0.1}] * 19)
    c2w[7, :3, :3] = 0.0
    singular = write_pose_json(tmp_path / "singular.json", c2w)
    with pytest.raises(ValueError, match=r"the camera matrix \(extrinsic\) of latent frame 7 is not invertible"):
        run_overrides([*TINY, f"paths.results_dir={tmp_path}", f"generation.worldplay.trajectory={singular}"])


def test_a_short_pose_string_and_a_too_large_memory_are_refused_before_any_model_loads(tmp_path, no_model):
    with pytest.raises(ValueError, match=r"generation.worldplay.trajectory='w-3' is not allowed"):
        run_overrides([*TINY, f"paths.results_dir={tmp_path}", "generation.worldplay.trajectory=w-3"])
    with pytest.raises(ValueError, match=r"generation.worldplay.memory_frames=24 is not allowed"):
        run_overrides([*TINY, f"paths.results_dir={tmp_path}", "generation.worldplay.memory_frames=24"])
    from jensenkv.run.cli import precheck

    with pytest.raises(ValueError, match=r"generation.worldplay.memory is not allowed: generation.worldplay is null "
                                         r"for this model"):  # another model (RunConfig's refusal: test_worldplay_family)
        precheck(["model=tiny", "model.device=cpu", "generation.worldplay.memory=append"])


def test_each_prompt_uses_its_scene_and_every_scene_image_is_checked(tmp_path):
    from jensenkv.generation import WorldPlaySettings
    from jensenkv.models.config import ModelConfig
    from jensenkv.models.registry import family

    png(tmp_path / "good.png", 32, 32)
    png(tmp_path / "bad.png", 16, 16)
    wp = WorldPlaySettings(trajectory="orbit", scenes=[
        {"prompt": "a", "image": str(tmp_path / "good.png"), "trajectory": "turn"},
        {"prompt": "b", "image": str(tmp_path / "bad.png")}])
    assert wp.inputs("a") == (str(tmp_path / "good.png"), "turn")
    assert wp.inputs("b") == (str(tmp_path / "bad.png"), "orbit")  # no trajectory: the default
    assert wp.inputs("c") == (None, "orbit")
    from jensenkv.generation import GenerationConfig

    gen = GenerationConfig(num_chunks=5, frames_per_chunk=4, worldplay=wp)
    own = family("worldplay")
    tiny = ModelConfig(kind="worldplay", device="cpu", preset="tiny")
    own.check_inputs(tiny, gen, ["a", "c"])  # control: the prompts run have good inputs
    with pytest.raises(ValueError, match=r"generation.worldplay.image='.*bad.png' is not allowed: it is 16 x 16"):
        own.check_inputs(tiny, gen, ["a", "b"])
    real = ModelConfig(kind="worldplay", device="cpu", preset="8b", path="p", hunyuan_path="h", height=480, width=832)
    with pytest.raises(ValueError, match=r"generation.worldplay.image=None is not allowed: preset 8b is image-to-video: "
                                         r"give a first frame of 480 x 832 pixels"):
        own.check_inputs(real, gen, ["c"])


def test_the_hunyuan_vae_loads_through_diffusers_and_applies_its_scaling_factor(tmp_path):
    from diffusers import AutoencoderKLHunyuanVideo15

    from jensenkv.models.loaders import MissingWeightsError
    from jensenkv.models.worldplay.vae import load_hunyuan_vae

    with pytest.raises(MissingWeightsError, match=r"HunyuanVideo-1.5 VAE not found: expected .*vae/config.json"):
        load_hunyuan_vae(tmp_path / "vae", torch.float32, torch.device("cpu"))
    torch.manual_seed(0)
    small = dict(latent_channels=4, block_out_channels=(8, 8, 8, 8, 8), layers_per_block=1)
    AutoencoderKLHunyuanVideo15(**small, scaling_factor=2.0).save_pretrained(tmp_path / "vae")
    vae = load_hunyuan_vae(tmp_path / "vae", torch.float32, torch.device("cpu"))
    image = torch.rand(3, 32, 32) * 2 - 1
    latent = vae.encode(image)
    assert latent.shape == (1, 4, 1, 2, 2)  # 16x spatial
    raw = vae.vae.encode(image[None, :, None]).latent_dist.mode()
    assert torch.allclose(latent, 2.0 * raw)  # x scaling_factor, as WorldPlay
    video = vae.decode(torch.randn(1, 4, 2, 2, 2))
    assert video.shape == (5, 3, 32, 32) and 0 <= float(video.min()) and float(video.max()) <= 1  # 4 (F - 1) + 1


def test_the_hunyuan_encoders_name_the_missing_file(tmp_path):
    from jensenkv.models.loaders import MissingWeightsError
    from jensenkv.models.worldplay.text import load_prompt_encoder

    with pytest.raises(MissingWeightsError, match=r"HunyuanVideo-1.5 Qwen2.5-VL tokenizer not found: expected "
                                                  r".*tokenizer/tokenizer_config.json \(model.hunyuan_path\)"):
        load_prompt_encoder(tmp_path, torch.float32, torch.device("cpu"))


def test_the_tiny_encoders_are_seeded_and_read_prompt_and_image():
    from jensenkv.models.worldplay.text import TinyPromptEncoder

    enc = TinyPromptEncoder(24, 16, 20, seed=0)
    image = torch.rand(3, 32, 32) * 2 - 1
    a, b = enc("a stone bridge", image), TinyPromptEncoder(24, 16, 20, seed=0)("a stone bridge", image)
    assert torch.equal(a.text, b.text) and torch.equal(a.vision, b.vision)
    assert a.text.shape == (1, 3, 24) and a.vision.shape == (1, 16, 20)
    assert not torch.equal(enc("a wooden bridge", image).text, a.text)  # the words matter
    assert not torch.equal(enc("a stone bridge", -image).vision, a.vision)  # the image matters
    assert int(a.byt5_mask.sum()) == 0 and int(enc('a sign reading "OPEN"', image).byt5_mask.sum()) == 4  # quoted text


def test_a_changed_image_or_pose_file_changes_the_run_and_reference_ids(tmp_path):
    from jensenkv.run import preset

    png(tmp_path / "first.png", 32, 32, seed=0)
    pose = write_pose_json(tmp_path / "pose.json", poses_from_motions([{"forward": 0.1}] * 19))
    args = (*TINY, f"generation.worldplay.image={tmp_path / 'first.png'}", f"generation.worldplay.trajectory={pose}")

    def ids():
        spec = preset(*args)
        return spec.run_id, config_hash(spec.reference_identity(spec.prompts[0], 0))

    before = ids()
    assert ids() == before  # same files, same ids
    png(tmp_path / "first.png", 32, 32, seed=1)  # same path, other pixels
    after_image = ids()
    assert after_image[0] != before[0] and after_image[1] != before[1]
    write_pose_json(pose, poses_from_motions([{"forward": 0.2}] * 19))
    assert ids()[0] != after_image[0]


def test_the_command_line_prints_one_line_for_bad_input(tmp_path, capsys, no_model):
    from jensenkv.run.cli import main

    png(tmp_path / "small.png", 16, 16)
    for override, line in ((f"generation.worldplay.image={tmp_path / 'small.png'}",
                            r"generation.worldplay.image='.*small.png' is not allowed: it is 16 x 16 pixels"),
                           ("generation.worldplay.trajectory=w-3",
                            r"generation.worldplay.trajectory='w-3' is not allowed: it has 4 latent frames")):
        with pytest.raises(SystemExit) as exit_:
            main(["model=worldplay_tiny", "model.device=cpu", f"paths.results_dir={tmp_path}", override])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.match(rf"error: {line}", err[0]), err
