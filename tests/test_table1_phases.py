"""scripts/table1_phases.py: py-spy samples of make reproduce-table1 -> seconds per phase and per recipe line."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("table1_phases", ROOT / "scripts" / "table1_phases.py")
table1_phases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table1_phases)

SWEEP = 'process 1:"";process 2:"/bin/bash -c .venv/bin/python -m jensenkv.run -m experiment=table1";' \
        'process 3:".venv/bin/python -m jensenkv.run -m experiment=table1";process 4:"python -m joblib.loky"'
RAW = [
    f"{SWEEP};task (jensenkv/run/cli.py:346);generate (jensenkv/run/videos.py:112);attention_probes "
    "(jensenkv/attention/probes.py:103) 30",
    f"{SWEEP};task (jensenkv/run/cli.py:346);generate (jensenkv/run/videos.py:112);forward (x.py:1) 50",
    f"{SWEEP};Runner.score (jensenkv/run/runner.py:81);save_mp4 (jensenkv/eval/video_files.py:42) 10",
    'process 1:"";process 5:"/bin/bash -c .venv/bin/python -m jensenkv.run.noise_floor experiment=table1";'
    'process 6:".venv/bin/python -m jensenkv.run.noise_floor";generate_videos (jensenkv/generation/loop.py:9) 20',
    "a line without a count",
]


def test_samples_go_to_the_first_matching_phase_and_to_their_recipe_line():
    phases, commands = table1_phases.phase_seconds(RAW, rate=10.0)
    assert phases == {"probes (inside generation)": 3.0, "generation": 5.0,
                      "mp4 writing and the 256 px copies": 1.0, "noise floor": 2.0}
    assert commands == {".venv/bin/python -m jensenkv.run -m experiment=table1": 9.0,
                        ".venv/bin/python -m jensenkv.run.noise_floor experiment=table1": 2.0}


def test_a_run_under_the_second_make_goes_to_its_own_line_not_to_the_make_line():
    stack = ('process 1:"make reproduce-table1";process 2:"/bin/bash -c make --no-print-directory -j2 table1-runs";'
             'process 3:"make --no-print-directory -j2 table1-runs";'
             'process 4:"/bin/bash -c OMP_WAIT_POLICY=passive .venv/bin/python -m jensenkv.run.noise_floor";'
             'process 5:".venv/bin/python -m jensenkv.run.noise_floor";'
             'process 6:"/x/python -c from joblib.externals.loky import main";f (a.py:1)')
    assert table1_phases.recipe_command(stack) == "OMP_WAIT_POLICY=passive .venv/bin/python -m jensenkv.run.noise_floor"


def test_a_process_without_a_shell_above_it_is_named_by_its_own_command():
    assert table1_phases.recipe_command('process 7:"python -m x";f (a.py:1)') == "python -m x"
    assert table1_phases.recipe_command("f (a.py:1)") == "?"
    with pytest.raises(SystemExit):
        table1_phases.main(["--rate"])
