"""Every bad input of tests/data/bad_inputs.yaml stops ``python -m jensenkv.run`` in one line naming its key,
exit 2, before Hydra starts any job (the pre-check only: composing configs and reading file headers)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pipeline_testkit import ctrl_c_as_in_a_terminal

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bad_inputs", ROOT / "scripts" / "bad_inputs.py")
bad_inputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bad_inputs)
TABLE = bad_inputs.load_table()


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict[str, str]:
    return bad_inputs.make_fixtures(tmp_path_factory.mktemp("bad_inputs"))


def test_table_covers_the_issue_and_its_neighbours():
    names = [e["name"] for e in TABLE]
    assert len(names) == len(set(names)) and len(names) >= 60
    assert all(e.get("key") for e in TABLE)
    assert {"hang", "traceback", "accepted", "after launch", "unclear", "sweep", "neighbour"} <= \
        {e["item"] for e in TABLE}


# the issue's own items run in the fast suite; their neighbours (composition errors test_configs also covers)
# with the slow tests, so the table adds ~10 s to `make test`
CASES = [pytest.param(e, id=e["name"], marks=[pytest.mark.slow] if e["item"] == "neighbour" else [])
         for e in TABLE]


@pytest.mark.parametrize("entry", CASES)
def test_bad_input_stops_in_one_line_before_any_job(entry, fixtures, tmp_path, monkeypatch, capsys):
    import jensenkv.run.summary
    from jensenkv.run.cli import main

    def launched(*args, **kwargs):
        raise AssertionError(f"the pre-check let {entry['name']} through to Hydra")

    monkeypatch.setattr(jensenkv.run.summary, "run_with_summary", launched)
    monkeypatch.setenv("JENSENKV_RESULTS", str(tmp_path / "results"))
    args, env = bad_inputs.expand(entry, fixtures)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert entry["key"] in lines[0], lines[0]
    assert not (tmp_path / "results" / "runs").exists()  # no job wrote anything


# as a user meets them: a fresh `python -m jensenkv.run` per entry. Every environment-variable entry (a module
# that read one at import would escape the in-process run above) and the entries marked fresh.
FRESH = [pytest.param(e, id=e["name"]) for e in TABLE if e.get("env") or e.get("fresh")]


def test_the_fresh_process_sample_holds_every_environment_case():
    assert len(FRESH) >= 10 and any(e.get("fresh") and not e.get("env") for e in TABLE)


@pytest.mark.parametrize("entry", FRESH)
def test_bad_input_stops_a_fresh_process_in_one_line(entry, fixtures, tmp_path):
    outcome, stderr = bad_inputs.run_entry(entry, fixtures, tmp_path, timeout=120)
    assert outcome == "stopped", stderr[-2000:]


def _python_m_run(args: list[str], tmp_path: Path, **env: str):
    import os
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "jensenkv.run", *args], cwd=tmp_path, text=True,
                            env={**os.environ, "WANDB_MODE": "disabled", "JENSENKV_RESULTS": str(tmp_path / "r"),
                                 **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=ctrl_c_as_in_a_terminal)


def test_help_shows_with_a_bad_variable_in_the_environment(tmp_path):
    proc = _python_m_run(["--help"], tmp_path, WANDB_MODE="bogus")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert "python -m jensenkv.run" in out


@pytest.mark.parametrize("delay_s", [0.1, 0.3, 0.8])
def test_ctrl_c_while_loading_is_one_line(delay_s, tmp_path):
    """Ctrl-C in the first second (the libraries loading, or the pre-check): one line, exit 130, no job; never
    swallowed by a library's import (HF_HUB_OFFLINE=1, as every test sets it, is what exposed that)."""
    import signal
    import time

    proc = _python_m_run(["eval.num_prompts=1"], tmp_path)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 130, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("interrupted: before any job started"), err[-2000:]
    assert not (tmp_path / "r" / "runs").exists()
