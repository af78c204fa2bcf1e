"""The one rule of every report and figure writer (jensenkv.report.publish): committed files are replaced only
from a store holding the experiment they describe, else the report goes to <out>/partial/ with a one-line why;
all files or none; --results / $JENSENKV_RESULTS everywhere; left-out runs grouped by what differs; claim 3's
hint composes to the missing run; no absolute path in claims.md; the figures say their model and sizes."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch

from jensenkv.report import claims, figures, table1
from jensenkv.report.publish import PARTIAL, Part, publish, shown_path
from jensenkv.report.selection import comparable
from jensenkv.hashing import config_hash
from jensenkv.report.store_frame import load_results
from jensenkv.store.results import ResultsStore

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "results"


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A small store that lacks most of the experiment: BF16, RTN INT2 g32 none / taylor and RTN INT4 g32 none
    over 3 prompts x 1 seed; no other Table 1 row, no tradeoff grid, no noise floor, no probes."""
    from report_testkit import prompts, write_run

    from jensenkv.quant import QuantConfig

    root = tmp_path_factory.mktemp("publish") / "results"
    videos = prompts(3)

    def metrics(shift: float):
        return lambda i, seed, rep: {"psnr": 30.0 + shift + 0.1 * i, "delta_p_s_mean": 0.01 - shift / 100,
                                     "delta_p_s_abs_mean": 0.02}

    write_run(root, QuantConfig(method="none"), "none", metrics(0), videos, seeds=(0,), effective_bits=16.0)
    for bits, correction, shift in ((2, "none", 0.0), (2, "taylor", 0.5), (4, "none", 3.0)):
        write_run(root, QuantConfig(method="rtn", bits=bits, group_size=32), correction, metrics(shift), videos,
                  seeds=(0,), effective_bits=bits + 0.75)
    return root


def _committed_copy(out: Path) -> dict[Path, bytes]:
    """The committed tables, report and figures copied into ``out``; {path: bytes}."""
    names = [p for p in COMMITTED.iterdir() if p.is_file()] + list((COMMITTED / "figures").glob("*.png"))
    copied = {}
    for source in names:
        target = out / source.relative_to(COMMITTED)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        copied[target] = source.read_bytes()
    assert len(copied) > 10 and out / "claims.md" in copied and out / "figures" / "tradeoff.png" in copied
    return copied


def _unchanged(copied: dict[Path, bytes]) -> None:
    changed = [str(p) for p, data in copied.items() if p.read_bytes() != data]
    assert not changed


def _why(out: Path, report: str) -> str:
    lines = (out / PARTIAL / f"{report}.why.txt").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{report} is incomplete, missing: ")
    return lines[0]


# --- committed files stay byte-identical; the report goes to partial/ with its why ----------------------
@pytest.fixture(scope="module")
def ran(store, tmp_path_factory):
    """Every report and figure command run once on the incomplete store, into a copy of the committed files:
    (out, {path: committed bytes}, {command: its exit message})."""
    out = tmp_path_factory.mktemp("out")
    copied = _committed_copy(out)
    exits = {}
    for name, main, extra in (("table1", table1.main, ["--no-figures"]), ("claims", claims.main, []),
                              ("figures", figures.main, [])):
        with pytest.raises(SystemExit) as info:
            main(["--results", str(store), "--out", str(out), *extra])
        exits[name] = str(info.value)
    return out, copied, exits


def test_every_report_on_an_incomplete_store_keeps_the_committed_files(ran):
    out, copied, exits = ran
    _unchanged(copied)
    assert "incomplete" in exits["table1"] and "tables in" in exits["table1"] and "unchanged" in exits["table1"]
    assert "the committed claims.md is unchanged" in exits["claims"]
    assert "the committed figures are unchanged" in exits["figures"]
    assert "rtn+min_aligned INT2 (no run)" in _why(out, "table1")
    why = _why(out, "claims")
    assert "noise_floor.csv" in why and "qvg INT2 (no run)" in why and "rtn INT4 (no run)" not in why
    why = _why(out, "figures")
    assert "rtn INT2 g64 none (experiment=tradeoff)" in why and "rtn INT2 g32 taylor with attention probes" in why
    assert "rtn INT4 g32 none (experiment" not in why
    assert (out / PARTIAL / "table1.csv").is_file() and "## synthetic-video-model" in (out / PARTIAL / "claims.md").read_text()
    written = {p.name for p in (out / PARTIAL / "figures").glob("*.png")}
    assert written == {"tradeoff.png", "jensen_bias.png"}  # no probes: the others are skipped, with a reason


def _fake_samples(samples):
    return lambda prompts, seed: samples.plot_samples([(p, torch.rand(3, 3, 8, 8)) for p in prompts],  # (F, C, H, W)
                                                      samples.samples_title("tiny", seed))


def test_samples_with_another_seed_keep_the_committed_figure(tmp_path, monkeypatch, capsys):
    samples = _load_script("sample_frames")
    copied = _committed_copy(tmp_path)
    monkeypatch.setattr(samples, "build_samples", _fake_samples(samples))
    samples.main(["--out", str(tmp_path), "--seed", "3"])
    _unchanged(copied)
    assert "seed 0 (given: 3)" in _why(tmp_path, "samples")
    assert (tmp_path / PARTIAL / "figures" / "samples_int2.png").is_file()
    assert "the committed figure is unchanged" in capsys.readouterr().out
    monkeypatch.setenv("JENSENKV_RESULTS", str(tmp_path / "env"))  # its --out default: the runs' variable
    samples.main([])
    assert (tmp_path / "env" / "figures" / "samples_int2.png").is_file()


def test_samples_figure_names_model_quantizer_correction_and_frames():
    samples = _load_script("sample_frames")
    fig = samples.plot_samples([("BF16", torch.rand(3, 3, 8, 8)), ("INT2 + Taylor", torch.rand(3, 3, 8, 8))],
                               samples.samples_title("tiny", 0))
    title = fig._suptitle.get_text()
    assert all(word in title for word in ("tiny", "BF16", "INT2 RTN", "Taylor correction", "seed 0"))
    assert [ax.get_title() for ax in fig.axes[:3]] == ["frame 0", "frame 1", "frame 2"]
    plt.close(fig)


# --- all or none ----------------------------------------------------------------------------------------
def test_a_report_that_fails_halfway_writes_none_of_its_files(tmp_path):
    (tmp_path / "a.csv").write_text("committed a\n")

    def broken(path: Path) -> None:
        raise OSError("disk full while writing the last file")

    parts = [Part("t", {"a.csv": lambda p: p.write_text("new a\n"), "b.md": lambda p: p.write_text("new b\n")}),
             Part("f", {"figures/x.png": broken})]
    with pytest.raises(OSError, match="disk full"):
        publish(tmp_path, parts)
    assert (tmp_path / "a.csv").read_text() == "committed a\n" and not (tmp_path / "b.md").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".publish.lock") == ["a.csv"]  # no temp folder


def test_table1_fails_halfway_without_writing(store, tmp_path, monkeypatch):
    copied = _committed_copy(tmp_path)
    from jensenkv.report.table1_build import build_table1

    built = build_table1(store)
    made = []

    def last_fails(text: str):
        made.append(text)
        if len(made) < 5:
            return lambda path: path.write_text(text)
        return lambda path: (_ for _ in ()).throw(OSError("no space left on device"))  # table1_layers.csv, platform

    monkeypatch.setattr(table1, "text_file", last_fails)
    with pytest.raises(OSError, match="no space left"):
        table1.write_table1(store, tmp_path, figures=False, allow_incomplete=True, built=built)
    assert len(made) == 6
    _unchanged(copied)
    assert not (tmp_path / PARTIAL).exists() and not list(tmp_path.glob(".report.*"))


# --- --results and $JENSENKV_RESULTS ---------------------------------------------------------------------
def test_every_report_reads_jensenkv_results_and_results(tmp_path, monkeypatch):
    """Each command's store, from the variable and from --results (the work itself stubbed out)."""
    seen = []

    def stub(results_dir, *args, **kwargs):
        seen.append(str(results_dir))
        raise FileNotFoundError("stub")

    monkeypatch.setattr(table1, "build_table1", stub)
    monkeypatch.setattr(claims, "write_claims", stub)
    monkeypatch.setattr(figures, "write_figures", stub)
    commands = (table1.main, claims.main, figures.main)
    monkeypatch.setenv("JENSENKV_RESULTS", str(tmp_path / "from-env"))
    for main in commands:
        with pytest.raises(SystemExit, match="stub"):
            main([])
    monkeypatch.delenv("JENSENKV_RESULTS")
    for main in commands:
        with pytest.raises(SystemExit, match="stub"):
            main([])
        with pytest.raises(SystemExit, match="stub"):
            main(["--results", str(tmp_path / "flag")])
    assert seen == [str(tmp_path / "from-env")] * 3 + ["results", str(tmp_path / "flag")] * 3


# --- claims.md: no machine path --------------------------------------------------------------------------
def test_claims_never_write_an_absolute_path(ran, store, monkeypatch):
    out, _, _ = ran
    assert not str(store).startswith(str(ROOT))  # a results dir outside the project
    text = (out / PARTIAL / "claims.md").read_text()
    assert not re.search(r"(?<![.\w])/(tmp|root|home|work)/", text)
    assert f"--results {os.path.relpath(store, ROOT)}`" in text
    monkeypatch.setenv("JENSENKV_RESULTS", str(store))
    assert shown_path(store) == "$JENSENKV_RESULTS" and shown_path(ROOT / "results") == "results"


# --- left-out runs name what differs, grouped ------------------------------------------------------------
def test_left_out_lines_name_the_differing_fields_grouped(tmp_path):
    from report_testkit import prompts, write_run

    from jensenkv.quant import QuantConfig

    rtn = QuantConfig(method="rtn", bits=2, group_size=32)
    for correction in ("none", "taylor", "exact"):  # the chosen context: 3 settings
        write_run(tmp_path, rtn, correction, lambda i, s, r: {"psnr": 30.0}, prompts(4))
    for correction in ("none", "taylor"):  # two runs of other prompts and seeds: one group
        write_run(tmp_path, rtn, correction, lambda i, s, r: {"psnr": 30.0}, prompts(2), seeds=(0,))
    store = ResultsStore(tmp_path)
    record = next(r for r in store.iter_records() if len(r["identity"]["prompts"]) == 4)
    record["identity"]["sink_chunks"] = 1  # a staircase run: same prompts and seeds, another cache layout
    record["run_id"] = config_hash(record["identity"])
    store.write_record(record)
    selection = comparable(load_results(tmp_path), results_dir=tmp_path)
    assert selection.num_left_out == 3 and len(selection.left_out) == 2
    prompts_line = next(line for line in selection.left_out if line.startswith("2 runs"))
    assert "prompts: 2 items" in prompts_line and "(chosen: 4 items" in prompts_line
    assert "seeds: [0] (chosen: [0, 1, 2])" in prompts_line
    sink_line = next(line for line in selection.left_out if line.startswith("1 run "))
    assert "differing in sink_chunks: 1 (chosen: 0)" in sink_line and "prompts" not in sink_line


# --- claim 3's hint composes to the missing run -----------------------------------------------------------
def test_claim_3_hint_composes_to_the_missing_run(tmp_path):
    from jensenkv.report.hints import fill_overrides, twin_identity
    from report_testkit import explain_missing
    from jensenkv.run import preset

    def write(*overrides: str):  # a record as the runner writes it, per-video PSNR over the identity's videos
        spec = preset("experiment=table1", "quant=rtn_smooth", *overrides)
        identity = spec.identity()
        videos = [{"index": i, "prompt": p, "seed": s, "metrics": {"psnr": 30.0 + i % 5}, "missing": {}}
                  for i, (p, s) in enumerate((p, s) for p in identity["prompts"] for s in identity["seeds"])]
        ResultsStore(tmp_path).write_record(explain_missing({
            "run_id": spec.run_id, "experiment_name": spec.experiment_name, "identity": identity,
            "labels": spec.labels(), "metrics": {"psnr": 31.9375, "effective_bits": 2.75}, "missing": {},
            "per_prompt": videos, "created_at": "2026-12-01T00:00:00+00:00"}))
        return spec

    write("correction=none")
    spec = write("correction=taylor")
    overrides = fill_overrides(tmp_path, spec.run_id, 4)
    assert overrides is not None and overrides[0] == "experiment=table1"
    missing = config_hash(twin_identity(spec.identity(), 4, "none"))  # the uncorrected INT4 twin's run id
    assert preset(*overrides).run_id == missing != spec.run_id
    from jensenkv.report.options import load_options
    from jensenkv.report.paper_claims import claim_memory

    (opts,) = load_options(tmp_path).values()
    printed = " ".join(claim_memory(opts, 2, 4, "taylor")[0].missing)
    assert "`python -m jensenkv.run -m " + " ".join(overrides) + "`" in printed  # what claims.md says to run


# --- figures: one model, named; sizes from the runs; labels apart -----------------------------------------
def test_the_figures_name_their_model_and_what_each_point_averages(store, monkeypatch):
    monkeypatch.setattr(figures, "plot_jensen_bias", plt.figure)  # no data: not what this test looks at
    built = figures.build_figures(store)
    title = built.figures["tradeoff"].axes[0].get_title()
    assert title.startswith("synthetic-video-model:") and "3 prompts x 1 seed" in title
    built.close()
    fig = figures.plot_attention_mass({"x": pd.DataFrame({"layer": [0], "step": [0], "p_s": [0.5], "p_s_ref": [0.4],
                                                          "delta_p_s": [0.1]})}, title="tiny: attention mass")
    assert fig._suptitle.get_text() == "tiny: attention mass"
    plt.close(fig)


def test_tradeoff_labels_do_not_overlap():
    grid = pd.DataFrame([{"bits": b, "group_size": g, "correction": c, "effective_bits": b + 24 / g,
                          "psnr": 20 + 4 * b + shift - 8 / g}
                         for b in (2, 4) for g in (32, 64, 128) for c, shift in (("none", 0), ("taylor", 0.3))])
    fig = figures.plot_tradeoff(grid)
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in fig.axes[0].texts]
    assert len(boxes) == 6
    assert not [(i, j) for i in range(6) for j in range(i + 1, 6) if boxes[i].overlaps(boxes[j])]
    plt.close(fig)


def test_figures_refuse_to_mix_models(tmp_path):
    from test_claims import build_store

    root = build_store(tmp_path / "results")
    build_store(root, model="second-model")
    runs = load_results(root)
    chosen = sorted(set(runs["model"]))[0]  # neither is the built-in model: the first, sorted (model_choice)
    built = figures.build_figures(root)
    assert built.model == chosen
    titles = {name: (fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title())
              for name, fig in built.figures.items() if name != "jensen_bias"}
    assert titles and all(t.startswith(f"{chosen}:") for t in titles.values()), titles
    built.close()
    with pytest.raises(ValueError, match="--model='nope' is not allowed"):
        figures.build_figures(root, model="nope")
    assert figures.choose_model(runs, "second-model") == "second-model"
    selection = figures.rtn_runs(runs, "second-model", root)
    assert set(selection.runs["model"]) == {"second-model"}


def test_a_killed_reports_staging_folder_is_removed_by_the_next_report(tmp_path):
    from jensenkv.report.publish import Part, publish, text_file

    old, fresh = tmp_path / ".report.abc.tmp", tmp_path / ".publish"
    for folder in (old, fresh):
        (folder / "0").mkdir(parents=True)
    os.utime(old, (0, 0))  # an earlier version's, and one with no journal: neither ever committed
    publish(tmp_path, [Part("t", {"t.md": text_file("x")})])
    assert not old.exists() and not fresh.exists() and (tmp_path / "t.md").read_text() == "x"


# --- all or none under kill -9: a publish killed at any step leaves the old set or the new one ------------
TABLE1_SET = ("table1.csv", "table1.md", "table1.tex", "table1_layers.csv", "table1_videos.csv")
KILLED_AT = """
import os, signal, sys
from jensenkv.report import table1

k, steps, real_publish = int(sys.argv[1]), [0], table1.publish


def killing(real):  # SIGKILL this process just before its k-th file operation while publishing
    def step(*args, **kwargs):
        steps[0] += 1
        if steps[0] == k:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    return step


def publish(*args, **kwargs):
    for name in ("replace", "rename", "unlink", "rmdir"):
        setattr(os, name, killing(getattr(os, name)))
    return real_publish(*args, **kwargs)


table1.publish = publish
table1.main(sys.argv[2:])
"""


def _table1_set(out: Path) -> dict[str, bytes | None]:
    return {name: (out / name).read_bytes() if (out / name).exists() else None for name in TABLE1_SET}


def test_a_report_killed_at_any_step_of_publishing_leaves_all_old_or_all_new(store, tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    args = ["--results", str(store), "--no-figures", "--allow-incomplete"]
    old = {name: (COMMITTED / name).read_bytes() for name in TABLE1_SET}
    seen, k = [], 1
    while True:
        out = tmp_path / f"k{k}"
        out.mkdir()
        for name, data in old.items():
            (out / name).write_bytes(data)
        run = subprocess.run([sys.executable, "-c", KILLED_AT, str(k), *args, "--out", str(out)], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
        if run.returncode != -9:  # past the last step: it finished
            assert run.returncode == 1, run.stderr  # --allow-incomplete on an incomplete store: partial
            new = _table1_set(out)
            break
        with pytest.raises(SystemExit):  # the next report (claims, into the same out) recovers first
            claims.main(["--results", str(store), "--out", str(out)])
        assert not (out / ".publish").exists() and not list(out.glob(".report.*")), k
        seen.append(_table1_set(out))
        k += 1
    assert new != old and None not in new.values()
    assert k > len(TABLE1_SET) + 2  # the journal, every move and the clean-up were each a kill point
    assert all(s in (old, new) for s in seen), [k for k, s in enumerate(seen, 1) if s not in (old, new)]
    assert seen[0] == old and seen[-1] == new  # killed before the commit: the old set; after it: the new one


# --- one set of exit codes (jensenkv.exit_codes), run as a user runs them ------------------------------------
def _exit(report: str, *args: str) -> int:
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", f"jensenkv.report.{report}", *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=False)
    assert "Traceback" not in run.stderr, run.stderr
    return run.returncode


def test_every_report_exits_1_on_an_incomplete_store_3_on_a_damaged_one_2_on_bad_input(store, tmp_path):
    from jensenkv.exit_codes import BAD_INPUT, EPILOG, FAILED, PARTIAL

    out = str(tmp_path / "out")
    for report, extra in (("table1", ["--no-figures"]), ("claims", []), ("figures", [])):
        assert _exit(report, "--results", str(store), "--out", out, "--allow-incomplete", *extra) == PARTIAL, report
    damaged = tmp_path / "damaged"
    shutil.copytree(store, damaged)
    record = next(damaged.glob("runs/*/record.json"))
    record.write_text(record.read_text().replace('"per_prompt"', '"per_prompt_edited"', 1))  # its videos gone
    for report, extra in (("table1", ["--no-figures"]), ("claims", [])):
        assert _exit(report, "--results", str(damaged), "--out", out, *extra) == FAILED, report
    assert _exit("figures", "--results", str(store), "--out", out, "--model", "nope") == BAD_INPUT
    for main in (table1.main, claims.main, figures.main):
        with pytest.raises(SystemExit):
            main(["--help"])
    assert "130 interrupted" in EPILOG
