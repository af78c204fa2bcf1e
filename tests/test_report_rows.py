"""The report's one row-building path (``jensenkv.report.rows``): Table 1 and the claims pool replicates the
same way (every seed field, not only the rotation seed); the figures do not import the table (tests/test_layering.py
checks every report import for cycles and upward imports)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from jensenkv.quant import QuantConfig
from jensenkv.report.paper_claims import build_report
from jensenkv.report.table1_build import build_table1

from test_table1_rows import PROMPTS, SEEDS, write_run  # noqa: E402

DITHER = [QuantConfig(dither="subtractive", dither_seed=s) for s in (0, 1)]


def dither_psnr(i: int, seed: int, dither_seed: int) -> float:
    """Differs by dither seed far more than by the correction: pooling or pairing across seeds would show."""
    return 20.0 + 7.0 * dither_seed + i + 0.1 * seed


@pytest.fixture
def store(tmp_path):
    """BF16 and RTN with subtractive dither at two dither seeds (rotation seed 0 for both), none and taylor;
    taylor is +1 on every video of its seed, +0.5 more on the second prompt."""
    root = tmp_path / "results"
    write_run(root, QuantConfig(method="none"))
    for key in DITHER:
        write_run(root, key, "none", psnr=lambda i, s, r, d=key.dither_seed: dither_psnr(i, s, d))
        write_run(root, key, "taylor", psnr=lambda i, s, r, d=key.dither_seed: dither_psnr(i, s, d) + 1.0 + 0.5 * i)
    return root


def test_claims_and_table1_pool_a_non_rotation_seed_the_same_way(store):
    table = build_table1(store, correction="taylor").table
    cells = table[table["quantizer"] == "rtn+dither"].set_index("treatment")
    assert list(cells.index) == ["none", "taylor"] and (cells["num_runs"] == 2).all()  # one row, both seeds
    (rep,) = build_report(store)
    opts = rep.opts
    (row,) = [r for r in opts.rows if r != "bf16"]
    videos = 2 * len(PROMPTS) * len(SEEDS)
    for treatment in ("none", "taylor"):
        iv = opts.interval(row, treatment, "psnr")
        cell = cells.loc[treatment]
        assert iv.num_videos == cell["num_videos"] == videos  # the videos behind the cell ...
        assert iv.n == cell["num_clusters"] == len(PROMPTS)  # ... and the independent units: its prompts
        assert (iv.mean, iv.low, iv.high) == pytest.approx((cell["psnr"], cell["psnr_ci95_low"],
                                                             cell["psnr_ci95_high"]))
    paired = opts.paired(row, "taylor", "psnr")  # pairs within a dither seed: +1, +1.5
    assert paired.n == len(PROMPTS) and paired.num_videos == videos and paired.delta == pytest.approx(cells.loc["taylor", "delta_psnr"]) \
        == pytest.approx(1.25)
    assert (paired.low, paired.high) == pytest.approx((cells.loc["taylor", "delta_psnr_ci95_low"],
                                                       cells.loc["taylor", "delta_psnr_ci95_high"]))
    # per (prompt, seed), the replicates averaged: what the claims compare across rows
    by_video = opts.values(row, "taylor", "psnr").groupby(level=["prompt", "seed"]).mean()
    expected = {(p, s): sum(dither_psnr(i, s, d) + 1.0 + 0.5 * i for d in (0, 1)) / 2
                for i, p in enumerate(PROMPTS) for s in SEEDS}
    assert by_video.to_dict() == pytest.approx(expected)
    assert sum(expected.values()) / len(expected) == pytest.approx(cells.loc["taylor", "psnr"])
    assert "2 seeds pooled" in " ".join(rep.options["variant"])


def test_importing_the_figures_does_not_import_table1():
    code = ("import sys, jensenkv.report.figures; "
            "print(sorted(m for m in sys.modules if m.startswith('jensenkv.report.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "jensenkv.report.figures" in out and "jensenkv.report.table1" not in out
