"""Videos a person can watch: the runner's upscaled copies (outside the folder VBench scores) and the report's
BF16 | quantized | corrected strips, paired by the report's selection rule, of one model."""
from __future__ import annotations


import imageio.v2 as imageio
import pytest
import torch
from two_models import with_second_model

from jensenkv.eval.video_files import LONG_SIDE, UPSCALED_DIR, load_mp4, upscale, upscale_factor
from jensenkv.report.model_choice import BUILT_IN_MODEL
from jensenkv.report.videos import GAP, LABEL_HEIGHT, plan_strips, write_strips
from jensenkv.report.store_frame import load_results
from jensenkv.store.results import ResultsStore


def test_upscale_is_nearest_neighbour_by_an_integer_factor():
    video = torch.randint(0, 256, (3, 3, 16, 12), dtype=torch.uint8)  # (F, C, H, W)
    large = upscale(video)
    assert large.shape == (3, 3, 256, 192) and large.dtype == torch.uint8  # 16 x: 256 on the long side
    assert torch.equal(large[..., ::16, ::16], video)
    assert torch.equal(large[..., 15::16, 15::16], video)  # each pixel a 16 x 16 block
    assert upscale_factor(480, 832) == 1 and upscale(torch.zeros(1, 3, 480, 832)).shape[-1] == 832


def test_every_saved_video_has_an_upscaled_copy_outside_the_vbench_folder(results_store):
    store = ResultsStore(results_store)
    checked, exact = 0, 0
    for record in store.iter_records():
        run = store.run_dir(record["run_id"])
        for entry in [v for v in record["per_prompt"] if v.get("video")]:
            assert (run / UPSCALED_DIR / entry["video"]).is_file()
            if not checked:  # the first copy's size is read (each read starts ffmpeg)
                with imageio.get_reader(run / UPSCALED_DIR / entry["video"]) as reader:
                    assert reader.get_meta_data()["size"] == (LONG_SIDE, LONG_SIDE)  # 16 x 16 -> 256 x 256
            if record["labels"]["quantizer"] == "bf16":  # its video is the stored reference, known exactly
                truth = torch.load(store.ref_path(entry["reference_id"]), weights_only=True)["video"].float()
                original, large = load_mp4(run / "videos" / entry["video"]), load_mp4(run / UPSCALED_DIR / entry["video"])
                assert large.shape == (truth.shape[0], 3, LONG_SIDE, LONG_SIDE)  # every frame
                shrunk = large[..., 8::16, 8::16].float()  # one pixel per 16 x 16 block
                assert (shrunk - truth).abs().mean() < 3  # the codec's rounding, no more
                assert (original.float() - truth).abs().mean() > 3 * (shrunk - truth).abs().mean()  # and sharper
                exact += 1
            checked += 1
        assert sorted(p.name for p in (run / "videos").iterdir()) == \
            sorted(v["video"] for v in record["per_prompt"] if v.get("video"))  # VBench's folder: originals only
    assert checked >= 10 and exact >= 1


@pytest.fixture(scope="module")
def two_models(results_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("videos") / "results"
    return root, with_second_model(results_store, root)


def test_a_strip_pairs_bf16_and_the_uncorrected_and_corrected_runs_of_one_row(two_models):
    results, copies = two_models
    model, strips, skipped = plan_strips(results)
    assert model == BUILT_IN_MODEL and any(line.startswith("rtn INT2 g128: no pair") for line in skipped)
    runs = load_results(results).set_index("run_id")
    store = ResultsStore(results)
    rows = set()
    for strip in strips:
        bf16, quantized, corrected = strip.panels
        q_id, c_id = quantized.source.removeprefix("run "), corrected.source.removeprefix("run ")
        assert q_id not in copies and c_id not in copies  # the built-in model's runs only
        q, c = runs.loc[q_id], runs.loc[c_id]
        assert (q["correction"], c["correction"]) == ("none", "taylor")
        q_identity, c_identity = (store.read_record(r)["identity"] for r in (q_id, c_id))
        assert q_identity["key"] == c_identity["key"] and q_identity["value"] == c_identity["value"]  # one row,
        # one replicate (QuaRot's two rotation seeds are two replicates: the strip takes one, in both columns)
        videos = {(v["prompt"], v["seed"]): v for v in store.read_record(q_id)["per_prompt"]}
        assert bf16.source == f"reference {videos[(strip.prompt, strip.seed)]['reference_id']}"
        rows.add(strip.row)
    assert {"rtn INT2 g32", "rtn INT4 g32", "quarot+rtn INT2 g32"} <= rows
    assert "rtn INT2 g128" not in rows  # no uncorrected run to pair with


def test_strips_are_written_as_video_and_contact_sheet(two_models, tmp_path):
    results, _ = two_models
    model, (path,), _ = write_strips(results, tmp_path / "videos", rows=["rtn INT2 g32"])  # one prompt
    assert path.parent.name == "rtn-int2-g32_taylor"
    assert path.parent.parent == tmp_path / "videos" / model and path.with_suffix(".png").stat().st_size > 5_000
    strip = load_mp4(path)  # (F, C, label bar + 256, 3 panels of 256 + 2 gaps)
    assert strip.shape[-2:] == (LABEL_HEIGHT + LONG_SIDE, 3 * LONG_SIDE + 2 * GAP)
    (planned,) = [s for s in plan_strips(results)[1] if s.row == "rtn INT2 g32"]
    panels = [strip[:, :, LABEL_HEIGHT:, i * (LONG_SIDE + GAP):i * (LONG_SIDE + GAP) + LONG_SIDE] for i in range(3)]
    reference = upscale(torch.load(planned.panels[0].path, weights_only=True)["video"])
    quantized = load_mp4(planned.panels[1].path.parent.parent / UPSCALED_DIR / planned.panels[1].path.name)
    for panel, expected in ((panels[0], reference), (panels[1], quantized)):
        assert (panel.float() - expected.float()).abs().mean() < 8  # the right video in each column


@pytest.mark.slow
def test_strips_written_on_a_pool_equal_those_written_here(two_models, tmp_path):
    """make reproduce-table1 writes the strips on every core: the same files, byte for byte, in the same order."""
    results, _ = two_models
    rows = ["rtn INT2 g32", "rtn INT4 g32"]
    here = write_strips(results, tmp_path / "here", rows=rows, workers=1)
    pool = write_strips(results, tmp_path / "pool", rows=rows, workers=2)
    assert len(here[1]) >= 2 and [p.relative_to(tmp_path / "here") for p in here[1]] == \
        [p.relative_to(tmp_path / "pool") for p in pool[1]] and here[2] == pool[2]
    for path in here[1]:
        twin = tmp_path / "pool" / path.relative_to(tmp_path / "here")
        assert path.read_bytes() == twin.read_bytes()
        assert path.with_suffix(".png").read_bytes() == twin.with_suffix(".png").read_bytes()


def test_the_command_names_where_the_strips_are(two_models, tmp_path, capsys, monkeypatch):
    from jensenkv.report.videos import main

    results, _ = two_models
    args = ["--results", str(results), "--model", "a-second-model", "--strips", str(tmp_path / "v"),
            "--row", "qvg INT2 g32", "--figure", "--out", str(tmp_path / "o")]
    main(args)  # the store holds Table 1's rows: the figure is the committed one
    out = capsys.readouterr().out
    assert f"1 strip of a-second-model (BF16 | quantized | taylor) under {tmp_path / 'v' / 'a-second-model'}" in out
    assert (tmp_path / "o" / "figures" / "video_strip.png").stat().st_size > 5_000
    before = (tmp_path / "o" / "figures" / "video_strip.png").read_bytes()
    import jensenkv.report.table1_build as table1_build

    monkeypatch.setattr(table1_build, "missing_rows", lambda *a, **k: ["rtn INT2 g32 (no run)"])
    with pytest.raises(SystemExit, match=r"incomplete: video_strip is incomplete, missing: rtn INT2 g32 \(no run\)"):
        main(args)  # a store lacking part of Table 1: partial/, never over the committed figure
    assert (tmp_path / "o" / "figures" / "video_strip.png").read_bytes() == before
    assert (tmp_path / "o" / "partial" / "figures" / "video_strip.png").stat().st_size > 5_000
    assert (tmp_path / "o" / "partial" / "video_strip.why.txt").read_text().count("\n") == 1
    with pytest.raises(SystemExit, match="--model='nope' is not allowed"):
        main(["--results", str(results), "--model", "nope"])
    with pytest.raises(SystemExit, match=r"--row=\['rtn INT9'\] is not allowed: use rows of tiny's options"):
        main(["--results", str(results), "--row", "rtn INT9"])



PLAN = """
import sys
import jensenkv.report.videos as videos
real = videos._video_entries
def many_prompts(store, run_id):  # the run's one saved video, as if 8 prompts x 2 seeds were saved (record order)
    (entry,) = real(store, run_id).values()
    return {(f"prompt {i}", seed): {**entry, "prompt": f"prompt {i}", "seed": seed} for seed in (1, 0) for i in range(8)}
videos._video_entries = many_prompts
print([(s.row, s.prompt, s.seed) for s in videos.plan_strips(sys.argv[1])[1]][:3])
"""


def test_the_strips_and_the_figures_prompt_do_not_depend_on_the_hash_seed(results_store):
    """Fresh processes with other PYTHONHASHSEED values (other string hashes, other set orders) plan the same
    strips, the figure's first one on the run's first prompt at its smallest seed: --figure shows one prompt on
    every regeneration."""
    import os
    import subprocess
    import sys

    def planned(hash_seed: str) -> str:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": os.pathsep.join(sys.path)}
        return subprocess.run([sys.executable, "-c", PLAN, str(results_store)], env=env, check=True,
                              capture_output=True, text=True).stdout
    answers = {seed: planned(seed) for seed in ("0", "1", "2")}
    assert len(set(answers.values())) == 1, answers
    assert answers["0"].startswith("[('rtn INT2 g32', 'prompt 0', 0)"), answers["0"]  # the record's first prompt
