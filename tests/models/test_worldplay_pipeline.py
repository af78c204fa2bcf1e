"""HY-WorldPlay end to end on the tiny preset: WorldPlay's schedule, the loop (memory with retrieval, rebuild vs
append, BF16 latent storage, CFG branches) and `python -m jensenkv.run model=worldplay_tiny quant.bits=2
correction=taylor` writing a record with dP_S and PSNR against its BF16 reference."""
from __future__ import annotations

import pytest
import torch

from jensenkv.cache import ChunkedKVCache
from jensenkv.generate import flow_sigmas, generate_video
from jensenkv.models.adapters import build_adapter
from jensenkv.models.worldplay.schedule import worldplay_sigmas, worldplay_timesteps
from jensenkv.run import preset, run_overrides
from jensenkv.report.store_frame import load_attention
from jensenkv.store.results import ResultsStore

TINY = ("model=worldplay_tiny", "model.device=cpu")


def adapter_of(*overrides: str, quantized: bool = True):
    spec = preset(*TINY, *overrides)
    cache = spec.cache_config(False) if quantized else spec.reference_cache_config()
    return spec, build_adapter(spec.model, cache, spec.attention, spec.generation)


def test_the_distilled_schedule_gives_worldplays_timesteps():
    assert worldplay_timesteps(4, 5.0).tolist() == pytest.approx([1000.0, 937.5, 833.3333, 625.0], abs=1e-4)
    assert worldplay_timesteps(4, 5.0).dtype == torch.float32
    s = torch.linspace(1, 0, 51)  # float32 throughout, as WorldPlay's scheduler
    assert torch.equal(worldplay_sigmas(50, 5.0), 5.0 * s / (1 + 4.0 * s))
    # the generator's flow_sigmas is the same formula in float64, rounded once: equal at 4 steps, 1 ulp off at 50
    assert torch.equal(flow_sigmas(4, 5.0), worldplay_sigmas(4, 5.0))
    assert 0 < (flow_sigmas(50, 5.0) - worldplay_sigmas(50, 5.0)).abs().max() <= 1.2e-7


def test_int2_keys_leave_chunk_zero_unchanged_and_change_the_later_chunks():
    spec, quantized = adapter_of("quant.bits=2", "correction=taylor", "generation.num_chunks=3")
    _, reference = adapter_of("generation.num_chunks=3", quantized=False)
    a = generate_video(quantized, "a bridge", 0).latents  # (1, C, 12, h, w)
    b = generate_video(reference, "a bridge", 0).latents
    per_frame = (a - b).abs().amax(dim=(0, 1, 3, 4))
    assert torch.equal(per_frame[:4], torch.zeros(4))  # chunk 0 has no memory: nothing quantized yet
    assert (per_frame[4:] > 1e-3).all()
    again = generate_video(quantized, "a bridge", 0).latents
    assert torch.equal(a, again)  # same seed, same video (the retrieval's point cloud is seeded too)


def test_without_quantization_the_cache_reproduces_full_precision():
    # the run's cache with quant=bf16 (method none) against the reference cache of a quantized run, both float32
    _, none = adapter_of("quant=bf16", "cache.full_precision_dtype=float32", "generation.num_chunks=3")
    _, reference = adapter_of("quant.bits=2", "cache.full_precision_dtype=float32", "generation.num_chunks=3",
                              quantized=False)
    a = generate_video(none, "a bridge", 0).latents
    assert torch.equal(a, generate_video(reference, "a bridge", 0).latents)
    _, bf16 = adapter_of("quant=bf16", "generation.num_chunks=3")  # control: BF16 storage moves chunks 1+
    assert not torch.equal(a, generate_video(bf16, "a bridge", 0).latents)


def test_the_tiny_preset_retrieves_a_past_chunk_and_stores_bf16_latents():
    spec, ad = adapter_of("quant=bf16", "generation.steps=2")
    result = generate_video(ad, "a bridge", 0)
    assert ad.memory_log == [[], [0, 1, 2, 3], list(range(8)), list(range(12)), [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]]
    latents = result.latents
    assert torch.equal(latents.to(torch.bfloat16).float(), latents)  # stored in BF16 between steps
    _, fp32 = adapter_of("quant=bf16", "generation.worldplay.latent_dtype=float32", "generation.num_chunks=2",
                         "generation.worldplay.memory_frames=8")
    wide = generate_video(fp32, "a bridge", 0).latents
    assert not torch.equal(wide.to(torch.bfloat16).float(), wide)  # control: float32 storage is not BF16


def commits_per_layer(monkeypatch, memory: str) -> int:
    calls = []
    original = ChunkedKVCache.commit

    def counting(self, k, v):
        calls.append(id(self))
        return original(self, k, v)

    monkeypatch.setattr(ChunkedKVCache, "commit", counting)
    _, ad = adapter_of("quant.bits=2", f"generation.worldplay.memory={memory}", "generation.steps=1")
    generate_video(ad, "a bridge", 0)
    monkeypatch.setattr(ChunkedKVCache, "commit", original)
    return len(calls) // (2 * 2)  # per (layer, stream): 2 layers x RoPE and ProPE caches


def test_rebuild_requantizes_the_memory_every_chunk_and_append_quantizes_each_chunk_once(monkeypatch):
    # memories of 4, 8, 12, 12 frames = 1 + 2 + 3 + 3 four-frame commits rebuilt; append: each chunk once
    assert commits_per_layer(monkeypatch, "rebuild") == 9
    assert commits_per_layer(monkeypatch, "append") == 4


def test_cfg_runs_the_negative_prompt_in_its_own_caches():
    short = ("quant=bf16", "generation.num_chunks=2", "generation.worldplay.memory_frames=8")
    _, plain = adapter_of(*short)
    _, guided = adapter_of(*short, "generation.guidance_scale=6.0", "generation.negative_prompt=blurry")
    a = generate_video(plain, "a bridge", 0).latents
    b = generate_video(guided, "a bridge", 0).latents
    assert not torch.allclose(a, b)
    assert guided._caches["uncond"].text and guided._caches["uncond"].num_frames == 4  # its own text and memory
    assert plain._caches["uncond"].text == []


def test_the_tiny_run_writes_a_record_with_delta_ps_and_psnr(tmp_path):
    record = run_overrides([*TINY, "eval.num_prompts=1", "logger=disabled", "eval.metrics=[psnr,attention]",
                            f"paths.results_dir={tmp_path}", "quant.bits=2", "correction=taylor"])
    metrics = record["metrics"]
    assert metrics["effective_bits"] == 2.75  # 2 bits + (16-bit step + 8-bit zero) / 32 channels
    assert metrics["delta_p_s_abs_mean"] > 0 and 0 < metrics["p_s_mean"] < 1
    assert 0 < metrics["psnr"] < float("inf")
    # the last chunk's memory: 12 frames x 64 tokens, K and V, 2 heads x 32 channels, 2 layers x 2 streams
    assert metrics["cache_bytes"] == 2 * 2 * (12 * 64) * 2 * (2 * 32) * 2.75 / 8
    # the probe table, with WorldPlay's own text column (the key stream), reads back whole, and a rerun is a no-op
    probes = load_attention(tmp_path, record["run_id"])
    assert set(probes["stream"]) == {"rope", "prope"} and probes["p_s"].dtype == float
    assert ResultsStore(tmp_path).damage(record["run_id"]) is None
    again = run_overrides([*TINY, "eval.num_prompts=1", "logger=disabled", "eval.metrics=[psnr,attention]",
                           f"paths.results_dir={tmp_path}", "quant.bits=2", "correction=taylor"])
    assert again["created_at"] == record["created_at"]


def test_calibration_fits_a_strength_per_layer_and_head_from_both_key_streams(tmp_path):
    import json

    from jensenkv.calibration.fit import calibrate_overrides

    path = calibrate_overrides([*TINY, "quant=rtn", "correction=taylor", "eval.num_prompts=1", "generation.num_chunks=2",
                                "generation.worldplay.memory_frames=8", "generation.steps=2",
                                f"paths.results_dir={tmp_path}"])
    content = json.loads(path.read_text())
    assert len(content["strengths"]) == 2 and all(len(row) == 2 for row in content["strengths"])  # 2 layers x 2 heads
    # chunk 1 probed at 2 steps in 2 layers, its cached RoPE and ProPE keys each a record
    assert content["fit"]["probe_records"] == 2 * 2 * 2
    assert all(v is not None for row in content["strengths"] for v in row)


def test_the_8b_adapter_names_the_missing_file(tmp_path):
    from jensenkv.models.config import ModelConfig
    from jensenkv.models.loaders import MissingWeightsError

    (tmp_path / "wp" / "ar_model").mkdir(parents=True)
    (tmp_path / "hy").mkdir()
    spec = preset(*TINY)
    model = ModelConfig(kind="worldplay", device="cpu", preset="8b", path=str(tmp_path / "wp"),
                        hunyuan_path=str(tmp_path / "hy"), height=480, width=832, dtype="bfloat16")
    with pytest.raises(MissingWeightsError, match=r"HY-WorldPlay transformer weights not found: looked for .*ar_model/"
                                                  r"model.safetensors"):
        build_adapter(model, spec.cache_config(False), spec.attention, spec.generation)
    absent = ModelConfig(kind="worldplay", device="cpu", preset="8b", path=str(tmp_path / "none"),
                         hunyuan_path=str(tmp_path / "hy"), height=480, width=832)
    with pytest.raises(MissingWeightsError, match=r"model.path='.*none' is neither a local folder nor in the Hugging"):
        build_adapter(absent, spec.cache_config(False), spec.attention, spec.generation)
