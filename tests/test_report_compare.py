"""report.compare: a rerun's results against the committed ones, every cell within its tolerance (derived from
the noise floor and the cell's own interval), every verdict equal; exit 0 only then (4 otherwise)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from jensenkv.exit_codes import DIFFERS
from jensenkv.report.compare import FILES, committed_results, main
from jensenkv.report.publish import PROJECT

RESULTS = PROJECT / "results"
PRIMARY = ("RTN, integer zero", 2, "none")  # label, bits, treatment of Table 1's primary row


def _copy(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    out.mkdir()
    for file in FILES:
        if (RESULTS / file).is_file():
            shutil.copyfile(RESULTS / file, out / file)
    return out


def _run(capsys, *args: str) -> tuple[int, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().out


def _edit_table1(folder: Path, column: str, change) -> None:
    table = pd.read_csv(folder / "table1.csv")
    row = (table["label"] == PRIMARY[0]) & (table["bits"] == PRIMARY[1]) & (table["treatment"] == PRIMARY[2])
    table.loc[row, column] = change(table.loc[row, column])
    table.to_csv(folder / "table1.csv", index=False)


def test_identical_files_compare_identical_and_exit_0(tmp_path, capsys):
    code, out = _run(capsys, str(_copy(tmp_path, "rerun")), str(RESULTS))
    assert code == 0, out
    assert "table1.csv: identical" in out and "claims.md: identical" in out
    assert "reproduced: every number within tolerance, every verdict equal" in out
    assert "platform, committed" not in out  # platforms shown only when a file differs


def test_float_noise_is_within_tolerance(tmp_path, capsys):
    rerun = _copy(tmp_path, "rerun")
    _edit_table1(rerun, "psnr", lambda v: v + 0.004)  # a hundredth of a dB's order: what another CPU moves
    _edit_table1(rerun, "ssim", lambda v: v * (1 + 1e-6))
    videos = pd.read_csv(rerun / "table1_videos.csv")
    videos["psnr"] += 1e-3
    videos.to_csv(rerun / "table1_videos.csv", index=False)
    code, out = _run(capsys, str(rerun), str(RESULTS))
    assert code == 0, out
    assert "table1.csv: within tolerance (2 of" in out and "table1_videos.csv: within tolerance" in out
    assert "platform, committed:" in out and "platform, rerun:" in out


def test_a_cell_moved_by_half_a_db_is_beyond_tolerance_and_named(tmp_path, capsys):
    rerun = _copy(tmp_path, "rerun")
    _edit_table1(rerun, "psnr", lambda v: v + 0.5)
    code, out = _run(capsys, str(rerun), str(RESULTS))
    assert code == DIFFERS, out
    line = next(x for x in out.splitlines() if x.startswith("table1.csv"))
    assert "BEYOND tolerance" in line and "RTN, integer zero" in line and "] psnr:" in line, line
    assert "claims.md: identical" in out and "reproduced: NO" in out


def test_a_changed_verdict_is_beyond_tolerance(tmp_path, capsys):
    rerun = _copy(tmp_path, "rerun")
    claims = (rerun / "claims.md").read_text()
    row = "| rtn INT2 g32              | -0.0086 [-0.0096, -0.0077]  |"
    assert claims.count(row) == 1
    line = next(x for x in claims.splitlines() if x.startswith(row))
    (rerun / "claims.md").write_text(claims.replace(line, line.replace("| reversed ", "| holds    ")))
    code, out = _run(capsys, str(rerun), str(RESULTS))
    assert code == DIFFERS, out
    assert "claims.md: BEYOND tolerance: verdict tiny / Claim 1a" in out and "'reversed' -> 'holds'" in out


def test_a_file_missing_in_the_rerun_fails_and_a_bad_path_is_bad_input(tmp_path, capsys):
    rerun = _copy(tmp_path, "rerun")
    (rerun / "noise_floor.csv").unlink()
    code, out = _run(capsys, str(rerun), str(RESULTS))
    assert code == DIFFERS and "noise_floor.csv: BEYOND tolerance: missing in the rerun" in out
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path / "nope")])
    assert info.value.code == 2


def test_the_default_other_side_is_the_committed_results_from_git(tmp_path):
    """make reproduce-table1 rewrites results/ in place: the committed side comes from git HEAD."""
    committed = committed_results(PROJECT, tmp_path / "committed")
    for name in ("table1.csv", "claims.md", "noise_floor.csv"):
        assert (committed / name).is_file(), name
    with pytest.raises(FileNotFoundError, match="not a git checkout"):
        committed_results(tmp_path, tmp_path / "x")


def test_the_platform_record_holds_no_path_of_any_machine():
    """platform.json is committed: the machine's description, never a file path (a compiler's, a home's)."""
    import json
    import re

    from jensenkv.machine import platform_text

    def strings(x):
        if isinstance(x, dict):
            return [s for v in x.values() for s in strings(v)]
        return [s for v in x for s in strings(v)] if isinstance(x, list) else [x] if isinstance(x, str) else []

    for text in (platform_text(), (RESULTS / "platform.json").read_text()):
        assert not [s for s in strings(json.loads(text)) if re.search(r"(^|\s)/\w", s)]
