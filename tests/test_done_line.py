"""The console line a finished run ends with names what is missing, in one short clause."""
from __future__ import annotations

from jensenkv.run.done_line import done_line, short_reason

LPIPS_REASON = ("LPIPS backbone weights alexnet-owt-7be5be79.pth not found: put the file in hub/checkpoints "
                "($TORCH_HOME/hub/checkpoints) or run `make fetch-weights` on a machine with internet")
WEIGHTS = "weights missing: ~/.cache/vbench/amt_model/amt-s.pth (run `make fetch-weights` on a machine with internet)"
REFUSED = "VBench refuses dynamic_degree in custom_input mode (it needs VBench's standard prompt suite)"


def _record(**fields) -> dict:
    return {"metrics": {}, "missing": {}, "vbench_dimensions_used": [], **fields}


def test_one_of_five_vbench_dimensions_and_lpips_without_weights():
    record = _record(metrics={"psnr": 31.234, "ssim": 0.9512, "vbench": 97.18, "vbench_temporal_flickering": 0.9718,
                              "delta_p_s_mean": 0.00213},
                     missing={"lpips": LPIPS_REASON, "vbench_subject_consistency": WEIGHTS,
                              "vbench_background_consistency": WEIGHTS, "vbench_motion_smoothness": WEIGHTS,
                              "vbench_dynamic_degree": REFUSED},
                     vbench_dimensions_used=["temporal_flickering"])
    assert done_line(record) == (
        "psnr 31.23, ssim 0.951, vbench 97.18 (1 of 5 dimensions; 3 weights missing, 1 VBench refuses "
        "dynamic_degree in custom_input mode), dP_S +0.0021, "
        "lpips missing (LPIPS backbone weights alexnet-owt-7be5be79.pth not found)")


def test_every_dimension_scored_says_nothing_more():
    record = _record(metrics={"psnr": 20.0, "vbench": 95.0}, vbench_dimensions_used=["a", "b"])
    assert done_line(record) == "psnr 20.00, vbench 95.00"


def test_no_vbench_dimension_could_run():
    record = _record(metrics={"ssim": 0.5},
                     missing={"vbench": "no VBench dimension could run: subject_consistency: " + WEIGHTS,
                              "vbench_subject_consistency": WEIGHTS})
    assert done_line(record) == "ssim 0.500, vbench missing (0 of 1 dimensions; 1 weights missing)"


def test_a_bf16_run_groups_the_metrics_it_cannot_have():
    reason = "BF16 run: it is its own reference"
    record = _record(metrics={"vbench": 97.4}, vbench_dimensions_used=["temporal_flickering"],
                     missing={"psnr": reason, "ssim": reason, "lpips": reason, "attention": reason})
    assert done_line(record) == "vbench 97.40, psnr, ssim, lpips, dP_S missing (BF16 run)"


def test_short_reason_keeps_the_first_clause():
    assert short_reason(WEIGHTS) == "weights missing"
    assert short_reason("video identical to its BF16 reference (PSNR is infinite)") == \
        "video identical to its BF16 reference"
    assert short_reason("no probes") == "no probes"
