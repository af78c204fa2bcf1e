"""A damaged results store: a record or attention.csv that no longer holds what its run id says is named in one
line (the file and the field), counts as unfinished so the rerun regenerates it, and never thins a table.

One real store (the built-in model, random weights, RTN INT2 without and with the correction, two videos each)
is copied per case and damaged one way."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from jensenkv.store.record import DamagedStoreError
from jensenkv.report.table1_build import build_table1
from jensenkv.report.table1 import main as table1_main
from jensenkv.run import run_overrides
from jensenkv.run.summary import plan_runs
from jensenkv.report.store_frame import load_attention, load_results
from jensenkv.store.results import ResultsStore
from pipeline_testkit import fast_overrides

SETTINGS = ("eval.metrics=[psnr,attention,content]", "eval.seeds=[0,1]", "quant.bits=2", "quant.group_size=32",
            "generation.batch_size=1")  # a video made again alone is the video made before, to the bit
DAMAGED = "correction=taylor"  # the run every case damages


def _overrides(results: Path, weights: Path, correction: str) -> list[str]:
    return fast_overrides(results, weights, *SETTINGS, correction)


def _table(results: Path) -> list[tuple]:
    """What a Table 1 cell reads from the store: its treatment, videos and numbers."""
    table = build_table1(results).table
    return [tuple(row) for row in table[["treatment", "num_prompts", "num_videos", "psnr", "delta_p_s"]]
            .itertuples(index=False)]


def _videos(record: dict) -> list[dict]:
    """The per-video results, but their timings (a video made again takes its own time)."""
    return [{k: v for k, v in video.items() if k != "timings"} for video in record["per_prompt"]]


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_weights):
    root = tmp_path_factory.mktemp("damaged") / "results"
    records = {c: run_overrides(_overrides(root, tiny_weights, c)) for c in ("correction=none", DAMAGED)}
    return {"root": root, "record": records[DAMAGED], "table": _table(root), "weights": tiny_weights}


def _edit_record(change):
    def damage(path: Path) -> None:
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))
    return damage


def _edit_csv(change):
    def damage(path: Path) -> None:
        path.write_bytes(change(path.read_bytes()))
    return damage


def _text_value(data: bytes) -> bytes:
    """A number of the last row replaced by text of the same length (the file keeps its size)."""
    lines = data.split(b"\n")
    cells = lines[-2].split(b",")
    cells[-1] = b"x" * len(cells[-1])
    return b"\n".join([*lines[:-2], b",".join(cells), b""])


def _digit(data: bytes) -> bytes:
    """One digit of the last number of the last row changed: the file keeps its size and stays a sound table."""
    end = data.rstrip(b"\n").rfind(b".") + 2  # the first decimal of the last row's last float
    digit = data[end - 1:end]
    return data[:end - 1] + (b"1" if digit != b"1" else b"2") + data[end:]


def _psnr_plus_5(holder: dict) -> None:
    holder["metrics"]["psnr"] += 5


def _to_missing(video: dict) -> None:
    video["missing"]["psnr"] = "video identical to its BF16 reference (PSNR is infinite)"
    video["metrics"].pop("psnr")


CASES = {  # name: (file, damage, what the line says)
    "record without labels": ("record.json", _edit_record(lambda r: r.pop("labels")), "no labels"),
    "record without identity": ("record.json", _edit_record(lambda r: r.pop("identity")), "no identity"),
    "record without per_prompt": ("record.json", _edit_record(lambda r: r.pop("per_prompt")), "no per_prompt"),
    "one video removed": ("record.json", _edit_record(lambda r: r["per_prompt"].pop()),
                          "per_prompt holds 1 of the 2 videos"),
    "metric as text": ("record.json", _edit_record(lambda r: r["metrics"].update(psnr="abc")),
                       "metrics.psnr = 'abc' is not a number"),
    "bits as text": ("record.json", _edit_record(lambda r: r["labels"].update(bits="2")),
                     "labels.bits = '2' is not an integer"),
    "record not JSON": ("record.json", _edit_csv(lambda b: b[: len(b) // 2]), "not JSON"),
    "attention.csv deleted": ("attention.csv", lambda p: p.unlink(), "missing"),
    "attention.csv empty": ("attention.csv", _edit_csv(lambda b: b""), "empty"),
    "attention.csv header only": ("attention.csv", _edit_csv(lambda b: b.split(b"\n")[0] + b"\n"), "header only"),
    "attention.csv cut mid-row": ("attention.csv", _edit_csv(lambda b: b[:-7]), "truncated"),
    "attention.csv last rows lost": ("attention.csv", _edit_csv(lambda b: b"\n".join(b.split(b"\n")[:-4]) + b"\n"),
                                     "probe rows, the others"),
    "attention.csv binary": ("attention.csv", _edit_csv(lambda b: bytes(range(256)) * 8), "not text"),
    "attention.csv garbage header": ("attention.csv", _edit_csv(lambda b: b"garbage;header\n" + b),
                                     "header lacks the columns"),
    "attention.csv text values": ("attention.csv", _edit_csv(_text_value), "holds text where numbers belong"),
    # edited values that keep every file sound: each is caught by what the values must give, or by a digest
    "run-level psnr +5": ("record.json", _edit_record(lambda r: _psnr_plus_5(r)), "metrics.psnr = "),
    "a video's psnr +5 in the record": ("record.json", _edit_record(lambda r: _psnr_plus_5(r["per_prompt"][0])),
                                        "but the mean of its 2 videos is"),
    "a video's psnr moved to missing": ("record.json", _edit_record(lambda r: _to_missing(r["per_prompt"][0])),
                                        "but a video has no psnr value"),
    "correction relabelled": ("record.json", _edit_record(lambda r: r["labels"].update(correction="none")),
                              "labels.correction = 'none', but its identity gives 'taylor'"),
    "a reason reworded": ("record.json", _edit_record(lambda r: r["computed_from"].update(videos="edited")),
                          "content digest does not match"),
    "record of an older schema": ("record.json", _edit_record(lambda r: r.update(schema=1)), "record schema 1"),
    "attention.csv digit, same size": ("attention.csv", _edit_csv(_digit), "sha256 is not the one its record lists"),
    "a per-video result's psnr +5": ("prompts/0000.json", _edit_record(_psnr_plus_5), "changed since the run wrote it"),
    "a per-video probe table's digit": ("prompts/0001.attention.json", _edit_csv(lambda b: b.replace(b"0.", b"1.", 1)),
                                        "sha256 is not the one its record lists"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_run_is_named_regenerated_and_never_thins_a_table(case, store, tmp_path, caplog):
    file, damage, says = CASES[case]
    root = tmp_path / "results"
    shutil.copytree(store["root"], root)
    run_id = store["record"]["run_id"]
    path = ResultsStore(root).run_dir(run_id) / file
    damage(path)
    line = f"damaged run {run_id} ({path}): "

    # named in one line, by the store and by the report, which refuses to build a table without the run
    assert str(ResultsStore(root).damage(run_id)).startswith(line) and says in str(ResultsStore(root).damage(run_id))
    with pytest.raises(SystemExit) as refused:
        table1_main(["--results", str(root), "--no-figures"])
    named = [text for text in str(refused.value).splitlines() if line in text]
    assert len(named) == 1 and says in named[0], str(refused.value)
    assert not ResultsStore(root).has_record(run_id)

    # the rerun regenerates it (never "already finished") and the table reads as before the damage
    caplog.set_level(logging.INFO, logger="jensenkv.run")
    record = run_overrides(_overrides(root, store["weights"], DAMAGED))
    assert "already finished" not in caplog.text and line in caplog.text
    assert record["run_id"] == run_id and ResultsStore(root).damage(run_id) is None
    assert record["metrics"] == store["record"]["metrics"] and _videos(record) == _videos(store["record"])
    assert len(load_attention(root, run_id)) == store["record"]["files"]["attention.csv"]["rows"]
    assert _table(root) == store["table"]


def test_the_store_lists_every_damaged_run_and_a_sound_one_is_not_redone(store, tmp_path, caplog):
    root = tmp_path / "results"
    shutil.copytree(store["root"], root)
    runs = sorted(p.parent for p in root.glob("runs/*/record.json"))
    for run in runs:
        (run / "attention.csv").write_bytes(b"")
    with pytest.raises(DamagedStoreError) as info:
        load_results(root)
    lines = str(info.value).splitlines()
    assert [line.split()[2] for line in lines[:-1]] == [run.name for run in runs]  # one line per run
    assert "rerun" in lines[-1] and "nothing was deleted" in lines[-1]
    (planned,) = plan_runs(_overrides(root, store["weights"], DAMAGED))
    assert not planned.finished_before  # the sweep summary counts it as redone, not "already finished"

    shutil.rmtree(root)
    shutil.copytree(store["root"], root)
    caplog.set_level(logging.INFO, logger="jensenkv.run")
    assert plan_runs(_overrides(root, store["weights"], DAMAGED))[0].finished_before
    run_overrides(_overrides(root, store["weights"], DAMAGED))
    assert "already finished" in caplog.text and "damaged run" not in caplog.text


def test_a_damaged_per_video_result_is_made_again(store, tmp_path, caplog):
    """The rerun of a damaged run resumes from its per-video results: a garbled one is named and its video made
    again, never a traceback."""
    root = tmp_path / "results"
    shutil.copytree(store["root"], root)
    run_id = store["record"]["run_id"]
    _edit_record(lambda r: r["per_prompt"].pop())(ResultsStore(root).record_path(run_id))
    garbled = ResultsStore(root).prompt_result_path(run_id, 1)
    garbled.write_text('{"index": 1, "metrics": {')
    caplog.set_level(logging.INFO, logger="jensenkv.run")
    record = run_overrides(_overrides(root, store["weights"], DAMAGED))
    assert f"damaged run {run_id}" in caplog.text and str(garbled) in caplog.text
    assert ResultsStore(root).damage(run_id) is None and len(record["per_prompt"]) == 2
    assert record["per_prompt"][1]["metrics"] == pytest.approx(store["record"]["per_prompt"][1]["metrics"], rel=1e-3)


def test_a_kept_verdict_does_not_outlive_an_edit(store, tmp_path):
    """damage() keeps its verdict by the files' stat (a plan, its runner and its summary read attention.csv once);
    an edit in place that keeps the file's size and inode still reaches the next call."""
    root = tmp_path / "results"
    shutil.copytree(store["root"], root)
    run_id = store["record"]["run_id"]
    csv = ResultsStore(root).run_dir(run_id) / "attention.csv"
    assert ResultsStore(root).damage(run_id) is None
    inode, size = csv.stat().st_ino, csv.stat().st_size
    with open(csv, "r+b") as f:  # same inode, same size
        data = f.read()
        f.seek(0)
        f.write(_text_value(data))
    assert (csv.stat().st_ino, csv.stat().st_size) == (inode, size)
    assert "holds text where numbers belong" in str(ResultsStore(root).damage(run_id))
    assert not ResultsStore(root).has_record(run_id)


def test_a_regeneration_never_trusts_an_edited_per_video_result(store, tmp_path, caplog):
    """A per-video result with an edited PSNR, then its record truncated: the store names the record, and the
    rerun that regenerates it makes that video again instead of resuming from the edited value."""
    root = tmp_path / "results"
    shutil.copytree(store["root"], root)
    run_id = store["record"]["run_id"]
    video = ResultsStore(root).prompt_result_path(run_id, 0)
    _edit_record(_psnr_plus_5)(video)
    record_path = ResultsStore(root).record_path(run_id)
    record_path.write_bytes(record_path.read_bytes()[:100])
    assert str(ResultsStore(root).damage(run_id)).startswith(f"damaged run {run_id} ({record_path}): not JSON")

    caplog.set_level(logging.INFO, logger="jensenkv.run")
    record = run_overrides(_overrides(root, store["weights"], DAMAGED))
    named = [line for line in caplog.text.splitlines() if f"damaged run {run_id} ({video})" in line]
    assert len(named) == 1 and "content digest does not match" in named[0] and "making that video again" in named[0]
    assert record["metrics"] == store["record"]["metrics"] and _videos(record) == _videos(store["record"])
    assert _table(root) == store["table"]


def test_a_per_video_result_without_a_digest_is_made_again(store, tmp_path, caplog):
    """A per-video result written before results carried digests cannot be verified: its video is made again."""
    root = tmp_path / "results"
    shutil.copytree(store["root"], root)
    run_id = store["record"]["run_id"]
    video = ResultsStore(root).prompt_result_path(run_id, 1)
    _edit_record(lambda r: r.pop("digest"))(video)
    ResultsStore(root).record_path(run_id).unlink()  # killed before its record: the rerun resumes
    caplog.set_level(logging.INFO, logger="jensenkv.run")
    record = run_overrides(_overrides(root, store["weights"], DAMAGED))
    assert f"damaged run {run_id} ({video}): no content digest" in caplog.text
    assert record["metrics"] == store["record"]["metrics"] and _videos(record) == _videos(store["record"])
