"""Table 1 and the figures, from a real results store built by the pipeline (random-init tiny model)."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from jensenkv.report.figures import jensen_bias_curves, plot_tradeoff
from jensenkv.report.table1 import main, write_table1
from jensenkv.report.table1_cells import CSV_COLUMNS, select_runs
from jensenkv.report.table1_format import paper_table
from jensenkv.run import run_overrides
from jensenkv.report.store_frame import load_results

from pipeline_testkit import build_results_fixture, fast_overrides, write_random_tiny_weights  # noqa: E402

INT2 = ("quant.bits=2", "quant.group_size=32")


@pytest.fixture(scope="module")
def results(results_store):
    return results_store


@pytest.fixture(scope="module")
def written(results, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    return out, write_table1(results, out)


def test_table1_csv_has_one_row_per_table_run(results, written):
    out, paths = written
    table = pd.read_csv(paths["csv"])
    required = {"model", "quantizer", "label", "bits", "group_size", "rotation", "rotation_seeds", "correction",
                "treatment", "effective_bits", "psnr", "ssim", "lpips", "vbench", "content", "delta_p_s",
                "num_videos", "psnr_ci95_low", "psnr_ci95_high", "delta_psnr", "p_psnr"}
    assert required <= set(table.columns) and list(table.columns[: len(CSV_COLUMNS)]) == list(CSV_COLUMNS)
    assert set(table["quantizer"]) == {"bf16", "rtn", "rtn+min_aligned", "rtn+dither", "rtn+channel_mean",
                                       "quarot+rtn", "qvg"}
    assert set(table.loc[table["quantizer"] != "bf16", "group_size"]) == {32}  # g=128 runs belong to the trade-off
    assert len(table) == 1 + 2 * 6 + 2  # BF16; RTN INT2 (4 grids) / INT4, QuaRot (pooled), QVG x {none, taylor}
    runs = load_results(results).set_index("run_id")
    for _, row in table.iterrows():  # numbers are the records' (pooled cells: their mean), not invented
        ids = row["run_id"].split(";")
        assert row["effective_bits"] == pytest.approx(runs.loc[ids, "effective_bits"].mean())
        if row["quantizer"] != "bf16":
            assert row["psnr"] == pytest.approx(runs.loc[ids, "psnr"].mean())
            assert row["delta_p_s"] == pytest.approx(runs.loc[ids, "delta_p_s_mean"].mean())
    quarot = table[table["quantizer"] == "quarot+rtn"]
    assert (quarot["num_runs"] == 2).all() and (quarot["rotation_seeds"] == "0,1").all()


def test_missing_metrics_are_empty_with_a_reason(written):
    table = pd.read_csv(written[1]["csv"])
    quantized = table[table["quantizer"] != "bf16"]
    assert table["lpips"].isna().all()
    assert quantized["lpips_missing_reason"].str.contains("alexnet-owt-7be5be79.pth").all()
    assert table["psnr_missing_reason"].notna().tolist() == (table["quantizer"] == "bf16").tolist()
    assert table["vbench"].notna().all() and table["vbench_missing_reason"].isna().all()
    assert table["content"].between(0, 1).all() and table["content_missing_reason"].isna().all()  # BF16 too


def test_markdown_and_latex_follow_the_paper_layout(written):
    out, paths = written
    table = pd.read_csv(paths["csv"])
    md, tex = Path(paths["md"]).read_text(), Path(paths["tex"]).read_text()
    assert Path(paths["md"]).parent == out  # complete: written where asked
    for text in (md, tex, Path(paths["csv"]).read_text()):  # no machine paths in committed tables
        assert str(Path.home()) + "/" not in text and str(Path(__file__).resolve().parents[1]) not in text
    rtn2 = table[(table["quantizer"] == "rtn") & (table["bits"] == 2)].set_index("correction")
    cell = f"{rtn2.loc['none', 'psnr']:.2f} -> {rtn2.loc['taylor', 'psnr']:.2f}"
    assert cell in md and cell.replace("->", r"$\rightarrow$") in tex
    assert "| BF16 " in md and "QuaRot (2 rotation seeds) + RTN, integer zero" in md and "INT4 g32" in md
    assert "RTN, min-aligned zero, subtractive dither" in md and "RTN, integer zero, channel-mean smoothing" in md
    assert tex.count(r"\\") == 1 + 8  # header + BF16, RTN INT2 x 4 grids, RTN INT4, QuaRot INT2, QVG INT2
    assert tex.startswith(r"\begin{table}") and r"\end{tabular}" in tex
    assert "alexnet-owt-7be5be79.pth" in md  # the footnote says why LPIPS is n/a


def test_figures_are_written(written):
    out, paths = written
    # the store holds Table 1 but not experiment=tradeoff's grid: the complete tables go to out, the figures
    # (which describe the trade-off too) to out/partial/figures, with the one-line why
    assert Path(paths["csv"]).parent == out and "figures is incomplete, missing: " in paths["partial"]
    assert "(experiment=tradeoff)" in (out / "partial" / "figures.why.txt").read_text()
    for name in ("jensen_bias", "tradeoff", "attention_mass"):
        path = Path(paths[name])
        assert path.parent == out / "partial" / "figures" and path.stat().st_size > 10_000


def test_paper_table_cells_are_none_then_corrected():
    rows = pd.DataFrame([
        {"model": "m", "quantizer": "bf16", "bits": 16, "group_size": None, "rotation": "none", "correction": "none",
         "psnr": None, "ssim": None, "lpips": None, "vbench": 78.27, "content": 0.875},
        {"model": "m", "quantizer": "rtn", "bits": 2, "group_size": 32, "rotation": "none", "correction": "none",
         "psnr": 23.17, "ssim": 0.799, "lpips": 0.195, "vbench": 76.67, "content": 0.5},
        {"model": "m", "quantizer": "rtn", "bits": 2, "group_size": 32, "rotation": "none", "correction": "taylor",
         "psnr": 24.08, "ssim": 0.828, "lpips": 0.131, "vbench": 77.86},
    ])
    paper = paper_table(rows).set_index("quantizer")
    assert paper.loc["BF16", "PSNR"] == "-" and paper.loc["BF16", "VBench"] == "78.27"
    assert paper.loc["RTN", "PSNR"] == "23.17 -> 24.08" and paper.loc["RTN", "LPIPS"] == "0.195 -> 0.131"
    assert paper.loc["BF16", "Content"] == "0.88" and paper.loc["RTN", "Content"] == "0.50 -> n/a"  # no value: n/a


def test_select_runs_prefers_the_run_with_more_prompts():
    base = {"model": "m", "quantizer": "rtn", "bits": 2, "group_size": 32, "rotation": "none", "correction": "none",
            "values": "same", "sink_chunks": 0, "window_chunks": None, "strength": 1.0}
    runs = pd.DataFrame([{**base, "run_id": "few", "num_prompts": 2, "created_at": "2026-01-02"},
                         {**base, "run_id": "many", "num_prompts": 8, "created_at": "2026-01-01"},
                         {**base, "run_id": "g64", "group_size": 64, "num_prompts": 8, "created_at": "2026-01-01"},
                         {**base, "run_id": "sink", "sink_chunks": 1, "num_prompts": 8, "created_at": "2026-01-01"}])
    assert list(select_runs(runs)["run_id"]) == ["many"]


def test_jensen_bias_curves_match_monte_carlo_and_the_papers_taylor_error():
    curves = jensen_bias_curves(torch.tensor([0.5, 1.0, 2.0, 3.0]), samples=400_000)
    assert curves["monte_carlo"].to_numpy() == pytest.approx(curves["exact"].to_numpy(), rel=0.02, abs=1e-3)
    excess = (curves["taylor"] / curves["exact"] - 1).to_numpy()
    assert excess == pytest.approx([0.008, 0.03, 0.12, 0.24], abs=0.01)  # NOTES: 3% at 1, 12% at 2, 24% at 3
    assert curves["exact"].iloc[1] == pytest.approx(math.log(math.sinh(1.0)), rel=1e-9)


def test_tradeoff_plot_needs_its_columns():
    with pytest.raises(ValueError, match="effective_bits"):
        plot_tradeoff(pd.DataFrame({"psnr": [1.0]}))


def test_cli_without_runs_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no finished runs"):
        main(["--results", str(tmp_path)])


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A store where RTN INT2 ran over one prompt (BF16, none, taylor) plus two runs that must never be paired
    with those: taylor over two prompts (it wins on prompt count), none with other steps and seeds (newer)."""
    root = tmp_path_factory.mktemp("mixed")
    weights, results = write_random_tiny_weights(root / "weights"), root / "results"
    matched = build_results_fixture(results, weights, (("quant=bf16",), (*INT2, "correction=none"),
                                                       (*INT2, "correction=taylor")))
    more = run_overrides(fast_overrides(results, weights, *INT2, "correction=taylor", "eval.num_prompts=2"))
    other = run_overrides(fast_overrides(results, weights, *INT2, "correction=none", "generation.steps=3", "eval.seeds=[1]"))
    return results, {r["labels"]["correction"] if r["labels"]["quantizer"] != "bf16" else "bf16": r["run_id"]
                     for r in matched}, [more["run_id"], other["run_id"]]


def test_a_cell_pairs_runs_that_differ_only_in_the_correction(mixed):
    results, ids, strays = mixed
    chosen = select_runs(load_results(results))
    rtn = chosen[chosen["quantizer"] == "rtn"].set_index("correction")["run_id"]
    assert dict(rtn) == {"none": ids["none"], "taylor": ids["taylor"]}  # same prompts, seeds, steps, weights
    from jensenkv.report.table1_build import build_table1

    t1 = build_table1(results)
    left_out = "\n".join(t1.selection.left_out)
    assert all(run_id in left_out for run_id in strays)  # reported, not mixed in
    assert all(run_id not in set(t1.table["run_id"]) for run_id in strays)


def test_the_figures_use_the_same_runs(mixed, tmp_path):
    from jensenkv.report.figures import rtn_runs, write_figures
    from jensenkv.report.selection import latest

    results, ids, strays = mixed
    selection = rtn_runs(load_results(results))
    assert set(latest(selection.runs, ("bits", "group_size", "correction"))["run_id"]) == {ids["none"], ids["taylor"]}
    written = write_figures(results, tmp_path)
    assert all(run_id in written["left_out"] for run_id in strays)


def test_an_incomplete_table_says_what_it_compared_and_leaves_the_committed_one(mixed, tmp_path, capsys):
    results, ids, strays = mixed
    committed = {name: tmp_path / name for name in ("table1.csv", "table1.md", "table1.tex")}
    for path in committed.values():
        path.write_text("committed\n")
    with pytest.raises(SystemExit, match="incomplete") as info:
        main(["--results", str(results), "--out", str(tmp_path), "--no-figures"])
    assert "qvg INT2 (no run)" in str(info.value) and "unchanged" in str(info.value)
    assert all(path.read_text() == "committed\n" for path in committed.values())
    partial = pd.read_csv(tmp_path / "partial" / "table1.csv")
    assert set(partial["run_id"]) == set(ids.values())
    printed = capsys.readouterr().out
    assert f"none (run {ids['none']}) -> taylor (run {ids['taylor']})" in printed  # which runs each row compares
    assert "1 prompt(s)" in printed and all(run_id in printed for run_id in strays)


def test_each_model_is_compared_within_its_own_context():
    """Real models use natural-language prompts, the built-in one its grammar: one context per model."""
    from jensenkv.report.selection import comparable

    rows = [{"run_id": f"{model}-{corr}-{n}", "model": model, "context": f"{model}-{n}", "setting": f"{model}-{n}",
             "context_desc": f"{n} prompts", "correction": corr, "num_prompts": n, "created_at": "2026-01-01"}
            for model, n in (("tiny", 8), ("tiny", 1), ("skyreels", 4)) for corr in ("none", "taylor")
            if not (model == "tiny" and n == 1 and corr == "none")]
    selection = comparable(pd.DataFrame(rows))
    assert set(selection.runs["run_id"]) == {"tiny-none-8", "tiny-taylor-8", "skyreels-none-4", "skyreels-taylor-4"}
    assert len(selection.left_out) == 1 and "tiny-taylor-1" in selection.left_out[0]


@pytest.fixture(scope="module")
def three_prompts(tmp_path_factory, tiny_weights):
    results = tmp_path_factory.mktemp("ci") / "results"
    runs = [run_overrides(fast_overrides(results, tiny_weights, *INT2, f"correction={c}", "eval.num_prompts=3",
                                         "eval.seeds=[0,1]", "eval.metrics=[psnr,ssim,content]"))
            for c in ("none", "taylor")]
    return results, runs


def test_intervals_and_paired_differences_come_from_the_per_video_values(three_prompts):
    from jensenkv.report.intervals import add_intervals
    from jensenkv.report.rows import video_metrics

    results, (none, taylor) = three_prompts
    table = pd.DataFrame([{"run_id": r["run_id"], "correction": r["labels"]["correction"], "model": "tiny",
                           "row_id": "rtn INT2 g32", "treatment": r["labels"]["correction"],
                           "psnr": r["metrics"]["psnr"]} for r in (none, taylor)])
    out = add_intervals(table, video_metrics(results, table["run_id"])).set_index("correction")
    assert (out["num_videos"] == 6).all()
    per_video = {r["labels"]["correction"]: {(v["prompt"], v["seed"]): v["metrics"]["psnr"] for v in r["per_prompt"]}
                 for r in (none, taylor)}
    differences = [per_video["taylor"][k] - per_video["none"][k] for k in per_video["none"]]
    assert out.loc["taylor", "delta_psnr"] == pytest.approx(sum(differences) / len(differences))
    assert out.loc["taylor", "delta_psnr_ci95_low"] <= out.loc["taylor", "delta_psnr"] <= \
        out.loc["taylor", "delta_psnr_ci95_high"]
    assert 0 < out.loc["taylor", "p_psnr"] <= 1 and math.isnan(out.loc["none", "p_psnr"])
    for c in ("none", "taylor"):  # the run's mean lies in its own interval
        assert out.loc[c, "psnr_ci95_low"] <= out.loc[c, "psnr"] <= out.loc[c, "psnr_ci95_high"]
    assert math.isnan(out.loc["taylor", "p_lpips"])  # not computed: unknown, never zero


def test_layer_means_are_the_probes_per_layer_of_each_cell(results, written):
    from jensenkv.report.store_frame import load_attention

    layers = pd.read_csv(written[1]["layers"])
    table = pd.read_csv(written[1]["csv"])
    assert set(layers["quantizer"]) == set(table["quantizer"]) - {"bf16"}  # every quantized cell, BF16 has none
    rtn = table[(table["quantizer"] == "rtn") & (table["bits"] == 2) & (table["treatment"] == "taylor")].iloc[0]
    probes = load_attention(results, rtn["run_id"])
    expected = probes[probes["step"] >= 0].groupby("layer")["delta_p_s"].mean()
    got = layers[layers["run_id"] == rtn["run_id"]].set_index("layer")["delta_p_s"]
    assert got.to_dict() == pytest.approx(expected.to_dict())
    quarot = layers[(layers["quantizer"] == "quarot+rtn") & (layers["treatment"] == "none")]
    one_seed = load_attention(results, quarot["run_id"].iloc[0].split(";")[0])
    assert (quarot["num_probes"] == 2 * (one_seed["step"] >= 0).groupby(one_seed["layer"]).sum().to_numpy()).all()
