"""`python -m jensenkv.run model=magi1_tiny`: a quantized run writes a record with probes and fidelity."""
from __future__ import annotations

from jensenkv.run import run_overrides

FAST = ("model=magi1_tiny", "model.device=cpu", "generation.steps=4", "generation.num_chunks=3", "eval.num_prompts=1",
        "logger=disabled", "eval.metrics=[psnr,ssim,attention]")


def test_magi_tiny_int2_run_records_probes_and_fidelity(tmp_path):
    record = run_overrides([*FAST, f"paths.results_dir={tmp_path}", "quant=rtn", "quant.bits=2",
                            "quant.group_size=32", "correction=taylor"])
    metrics = record["metrics"]
    assert metrics["effective_bits"] == 2.75  # 2 bits + (16-bit step + 8-bit zero) / 32 channels
    assert metrics["delta_p_s_abs_mean"] > 0 and 0 < metrics["p_s_mean"] < 1
    assert 0 < metrics["ssim"] <= 1 and metrics["psnr"] > 0
    # 2 layers x 2 cached chunks (the last is never re-run) x K and V x 2 KV heads x 32 tokens x 32 channels
    assert metrics["cache_bytes"] == 2 * 2 * 2 * (2 * 32 * 32) * 2.75 / 8
