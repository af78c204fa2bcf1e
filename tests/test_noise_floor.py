"""The noise floor: harmless changes (float32 cache, threads, batch composition) measured against the video as
the run makes it, on random-init built-in-model weights."""
from __future__ import annotations

import math

import pandas as pd

from jensenkv.run import noise_floor
from pipeline_testkit import fast_overrides


def test_noise_floor_rows_with_a_no_op_control(tmp_path, tiny_weights, monkeypatch):
    monkeypatch.setattr(noise_floor, "PERTURBATIONS", {**noise_floor.PERTURBATIONS, "nothing": []})
    bases = ("bf16", "rtn INT2 g32 none", "quarot+rtn INT2 g32 none")  # the dither base works as QuaRot's does
    monkeypatch.setattr(noise_floor, "BASES", {k: noise_floor.BASES[k] for k in bases})
    overrides = [o for o in fast_overrides(tmp_path, tiny_weights) if not o.startswith("eval.metrics")]
    path = noise_floor.write_noise_floor([*overrides, "eval.num_prompts=2"])
    rows = pd.read_csv(path)
    assert path == tmp_path / "noise_floor.csv" and list(rows.columns) == list(noise_floor.COLUMNS)
    assert len(rows) == (3 * 4 + 1) * 2  # (bases x perturbations + QuaRot's rotation seed) x videos
    by = rows.set_index(["base", "perturbation"])
    assert by.loc[("bf16", "nothing"), "identical"].all()  # the control: no change, identical videos
    assert by.loc[("rtn INT2 g32 none", "nothing"), "d_psnr_vs_bf16"].eq(0).all()
    assert by.loc[("bf16", "in a batch"), "identical"].all()  # each video of a batch is what it is alone
    moved = by.loc[("bf16", "float32 cache"), "psnr_vs_unperturbed"]
    assert not by.loc[("bf16", "float32 cache"), "identical"].all()  # the cache's dtype moves 8-bit frames
    assert moved[moved.map(math.isfinite)].between(10, 200).all()
    assert by.loc[("bf16", "2 threads"), "d_psnr_vs_bf16"].isna().all()  # the BF16 base is its own reference
    assert by.loc[("rtn INT2 g32 none", "float32 cache"), "d_psnr_vs_bf16"].map(math.isfinite).all()
    rotated = by.loc[("quarot+rtn INT2 g32 none", "another rotation seed")]
    assert not rotated["identical"].any() and rotated["d_psnr_vs_bf16"].ne(0).all()  # another rotation, another video
