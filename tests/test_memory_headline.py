"""The memory headline's logic (jensenkv.bench.memory_headline) at a toy geometry and a small budget: the
frames-held rule, the ratios, a real child process's trajectory and the outputs. Not its numbers: those are
results/memory_headline.md, measured by `make memory-headline`."""
from __future__ import annotations

import pandas as pd
import pytest

from jensenkv.bench.memory_headline import (
    GIB, Geometry, frames_within, headline_rows, measure, skyreels_geometry, video_seconds, write_outputs,
)


def _trajectory(peaks_gib: list[float], stored_per_frame: float = 0.1, bf16_per_frame: float = 0.4) -> list[dict]:
    return [{"frames": i + 1, "peak_growth": p * GIB, "rss_growth": p * GIB, "stored": (i + 1) * stored_per_frame * GIB,
             "bf16": (i + 1) * bf16_per_frame * GIB, "workspace": 0.0} for i, p in enumerate(peaks_gib)]


def test_frames_within_is_the_last_frame_under_the_budget():
    trajectory = _trajectory([0.5, 1.0, 1.5, 2.5])
    assert frames_within(trajectory, 2.0 * GIB) == 3
    assert frames_within(trajectory, 1.0 * GIB) == 2  # a peak equal to the budget is within it
    assert frames_within(trajectory, 0.1 * GIB) == 0
    assert frames_within(trajectory, 3.0 * GIB) is None  # never passed: the budget holds more than was measured


def test_headline_rows_ratio_to_bf16_and_theory():
    trajectories = {"bf16": _trajectory([1.0, 2.0, 3.0], 0.4), "int2 g32": _trajectory([0.25 * i for i in range(1, 14)], 0.1)}
    rows = pd.DataFrame(headline_rows(trajectories, (2.5,))).set_index("quant")
    assert rows.loc["bf16", "frames_held"] == 2 and rows.loc["int2 g32", "frames_held"] == 10
    assert rows.loc["int2 g32", "ratio_to_bf16"] == 5.0 and rows.loc["bf16", "ratio_to_bf16"] == 1.0
    assert rows.loc["int2 g32", "theory_ratio"] == pytest.approx(4.0)  # BF16 bytes / stored bytes
    assert rows.loc["int2 g32", "video_seconds"] == pytest.approx(37 / 24)
    assert video_seconds(0) == 0.0 and video_seconds(1) == pytest.approx(1 / 24)


def test_skyreels_geometry_is_the_real_cache():
    g = skyreels_geometry()
    assert (g.layers, g.branches, g.heads, g.dim, g.frame_tokens) == (30, 2, 12, 128, 2040)
    bf16_frame = g.layers * g.branches * 2 * g.heads * g.frame_tokens * g.dim * 2  # K and V, 2 bytes
    assert bf16_frame == 752_025_600  # 0.70 GiB of BF16 cache per latent frame


def test_a_child_process_fills_until_the_budget_with_the_presets_bytes():
    """A fresh process at a toy geometry: stored bytes grow by one frame's stored form per frame (INT2 g=32: 2.75
    of 16 bits), its anonymous memory holds at least what is stored, and it stops at the first frame past the
    budget. Nothing here depends on the machine's load: how many frames pass is not asserted (library pages the
    kernel reclaims or faults back in move the total RSS), and measure's timeout only guards against a hang."""
    toy = Geometry(layers=2, branches=2, heads=2, dim=64, frame_tokens=2048, chunk_frames=1, queries=16)
    budget = 24 / 1024  # GiB
    trajectory = measure("int2 g32", toy, budget, max_frames=60)
    assert [t["frames"] for t in trajectory] == list(range(1, len(trajectory) + 1))
    assert trajectory[-1]["peak_growth"] > budget * GIB  # stopped past the budget ...
    assert all(t["peak_growth"] <= budget * GIB for t in trajectory[:-1])  # ... at the first frame past it
    per_frame = trajectory[0]["stored"]
    assert all(t["stored"] == t["frames"] * per_frame for t in trajectory)
    assert trajectory[-1]["stored"] / trajectory[-1]["bf16"] == pytest.approx(2.75 / 16)
    assert all(t["anon_growth"] >= 0.9 * t["stored"] for t in trajectory)
    assert trajectory[-1]["workspace"] > 0  # the attention call's workspace is in the measurement
    capped = measure("int2 g32", toy, 10.0, max_frames=2)
    assert len(capped) == 2 and frames_within(capped, 10.0 * GIB) is None  # capped below the budget: no answer


def test_outputs_are_written(tmp_path):
    trajectories = {"bf16": _trajectory([1.0, 2.0, 3.0], 0.4), "int2 g32": _trajectory([0.25 * i for i in range(1, 14)], 0.1)}
    rows = headline_rows(trajectories, (2.5,))
    write_outputs(rows, trajectories, skyreels_geometry(), tmp_path, tmp_path / "figures", 60.0)
    frame = pd.read_csv(tmp_path / "memory_headline.csv")
    assert {"quant", "budget_gib", "frames_held", "ratio_to_bf16", "theory_ratio", "video_seconds"} <= set(frame.columns)
    md = (tmp_path / "memory_headline.md").read_text()
    assert "INT2 g=32 >= 4.5x" in md and "2.5 GiB: 5.00x (met)" in md
    assert (tmp_path / "figures" / "memory_headline.png").stat().st_size > 1000
    steps = pd.read_csv(tmp_path / "memory_headline_frames.csv")
    assert len(steps) == 3 + 13 and set(steps.quant) == {"bf16", "int2 g32"}
    assert frame.ratio_to_bf16.notna().all()


def test_cli_refuses_an_unknown_quantizer_and_a_zero_budget():
    from jensenkv.bench.memory_headline import main

    with pytest.raises(SystemExit):
        main(["--quant", "int3"])
    with pytest.raises(SystemExit):
        main(["--budgets", "0"])
