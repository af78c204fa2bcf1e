"""Run the bad-input table (tests/data/bad_inputs.yaml) through ``python -m jensenkv.run`` and count what each met.

    PYTHONPATH=src python scripts/bad_inputs.py [--subprocess [--timeout 120]] [--only NAME ...] [--verbose]

By default each entry goes through the command-line entry ``jensenkv.run.cli.main`` in this process, with
Hydra's launch replaced by a stub: what the pre-check does with it, in seconds for the whole table. With
--subprocess each runs as ``python -m jensenkv.run`` in a scratch folder (a job Hydra starts leaves its
outputs/ or multirun/ folder there), jobs included. Either way each entry gets its own results dir
(JENSENKV_RESULTS, unless the entry sets it) and W&B disabled. What it met is one of:

    stopped    exit 2, one line on stderr naming the entry's key, no job started
    unclear    exit 2, one line, no job started, but the line does not name the key
    traceback  a Python traceback
    accepted   the pre-check let it through to Hydra (--subprocess: a job started, stopped 20 s later)
    hang       --subprocess: still running after --timeout seconds, or its job waiting on a lock when stopped
    other      anything else (several lines without a traceback, another exit status)

The same fixtures (``make_fixtures``) serve the in-process test (tests/test_bad_inputs.py).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests" / "data" / "bad_inputs.yaml"
GOOD_WEIGHTS = ROOT / "src" / "jensenkv" / "models" / "tiny" / "weights"
OUTCOMES = ("stopped", "unclear", "traceback", "accepted", "hang", "other")


def load_table(path: Path = TABLE) -> list[dict]:
    import yaml

    return yaml.safe_load(path.read_text())


def _weights_dir(root: Path, name: str, config: str | None, weights: bytes | None) -> str:
    """A tiny-model folder with this config.json text and model.safetensors bytes (None: the file is absent)."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.json").write_text(config)
    if weights is not None:
        (folder / "model.safetensors").write_bytes(weights)
    return str(folder)


def make_fixtures(root: Path) -> dict[str, str]:
    """The files the table's placeholders name, made under ``root``: {placeholder: path}."""
    root.mkdir(parents=True, exist_ok=True)
    config = (GOOD_WEIGHTS / "config.json").read_text()
    weights = (GOOD_WEIGHTS / "model.safetensors").read_bytes()
    stored = json.loads(config)
    no_patch = {**stored, "transformer": {k: v for k, v in stored["transformer"].items() if k != "patch_size"}}
    no_data = {k: v for k, v in stored.items() if k != "data"}
    a_file = root / "a_file.txt"
    a_file.write_text("not a folder\n")
    return {
        "tmp": str(root),
        "a_file": str(a_file),
        "missing": str(root / "does_not_exist.json"),
        "good_weights": str(GOOD_WEIGHTS),
        "weights_truncated": _weights_dir(root, "weights_truncated", config, weights[: len(weights) // 2]),
        "weights_garbled": _weights_dir(root, "weights_garbled", config, b"\x17garbage" * 64),
        "weights_empty": _weights_dir(root, "weights_empty", config, b""),
        "weights_absent": _weights_dir(root, "weights_absent", config, None),
        "config_missing_keys": _weights_dir(root, "config_missing_keys", json.dumps(no_patch), weights),
        "config_garbled": _weights_dir(root, "config_garbled", "{not json", weights),
        "config_empty": _weights_dir(root, "config_empty", "", weights),
        "config_no_data": _weights_dir(root, "config_no_data", json.dumps(no_data), weights),
        "weights_nan": _weights_dir(root, "weights_nan", config, _poisoned(weights, float("nan"))),
        "weights_inf": _weights_dir(root, "weights_inf", config, _poisoned(weights, float("inf"))),
        # a PATH without any SLURM client, whether or not this machine has one (PATH={no_slurm})
        "no_slurm": _empty_dir(root / "no_slurm_on_path"),
        # a SLURM client whose scheduler refuses every job with sbatch's own words (PATH={slurm_...}:/usr/bin:/bin)
        "slurm_no_gpus": fake_slurm(root / "slurm_no_gpus", "Invalid generic resource (gres) specification"),
        "slurm_small_memory": fake_slurm(root / "slurm_small_memory", "Memory specification can not be satisfied"),
        "slurm_no_controller": fake_slurm(root / "slurm_no_controller", "Batch job submission failed: Unable to "
                                          "contact slurm controller (connect failure)"),
    }


def _empty_dir(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)


def fake_slurm(folder: Path, refusal: str | None) -> str:
    """A folder with ``srun``, an ``sinfo`` that lists no node, and an ``sbatch`` that refuses (``sbatch: error: <refusal>``, exit 1) or, with
    None, accepts a --test-only submission; each call's arguments are appended to ``sbatch.calls``."""
    folder.mkdir(parents=True, exist_ok=True)
    answer = (f"echo 'sbatch: error: {refusal}' >&2; exit 1" if refusal is not None
              else 'echo "sbatch: Job 1 to start at 2026-01-01T00:00:00 using 1 processors on nodes n1"; exit 0')
    (folder / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> "{folder}/sbatch.calls"\n{answer}\n')
    (folder / "srun").write_text("#!/bin/sh\nexit 0\n")
    (folder / "sinfo").write_text("#!/bin/sh\nexit 1\n")  # no node list: the machine's own SLURM stays out of it
    for name in ("sbatch", "srun", "sinfo"):
        (folder / name).chmod(0o755)
    return str(folder)


def _poisoned(weights: bytes, value: float) -> bytes:
    """The tiny model's safetensors bytes with every value of its last floating tensor set to ``value``."""
    from safetensors.torch import load, save

    state = load(weights)
    name = [k for k, t in state.items() if t.is_floating_point()][-1]
    state[name] = state[name].clone().fill_(value)
    return save(state)


def expand(entry: dict, fixtures: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The entry's arguments and environment with the fixtures filled in."""
    args = [a.format(**fixtures) for a in entry.get("args") or []]
    env = {k: str(v).format(**fixtures) for k, v in (entry.get("env") or {}).items()}
    return args, env


def classify(returncode: int | None, stderr: str, key: str, job_started: bool) -> str:
    if returncode is None:
        return "hang"
    if "Traceback (most recent call last)" in stderr:
        return "traceback"
    if job_started or returncode == 0:
        return "accepted"
    lines = [line for line in stderr.splitlines() if line.strip()]
    if returncode == 2 and len(lines) == 1:
        return "stopped" if key in lines[0] else "unclear"
    return "other"


def run_entry(entry: dict, fixtures: dict[str, str], scratch: Path, timeout: float,
              job_grace: float = 20.0) -> tuple[str, str]:
    """(outcome, stderr) of one entry run through the command line. Once a job has started the entry is past
    the pre-check: it gets ``job_grace`` more seconds to fail with a traceback, then it is stopped."""
    import signal
    import time

    args, env = expand(entry, fixtures)
    cwd = scratch / entry["name"]
    cwd.mkdir(parents=True)
    full_env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                "JENSENKV_RESULTS": str(cwd / "results"), **env}
    command = [sys.executable, "-m", "jensenkv.run", *args]
    with open(cwd / "stderr.txt", "w+") as err:
        process = subprocess.Popen(command, cwd=cwd, env=full_env, stdout=subprocess.DEVNULL, stderr=err,
                                   start_new_session=True)  # its own group: a stop reaches Hydra's workers too
        start, job_seen = time.monotonic(), None
        while process.poll() is None:
            now = time.monotonic()
            if job_seen is None and ((cwd / "outputs").exists() or (cwd / "multirun").exists()):
                job_seen = now
            if now - start > timeout or (job_seen is not None and now - job_seen > job_grace):
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                break
            time.sleep(0.2)
        err.seek(0)
        stderr = err.read()
    job_started = job_seen is not None or (cwd / "outputs").exists() or (cwd / "multirun").exists()
    stopped = process.returncode == -signal.SIGKILL
    # stopped while waiting on a lock (a results dir it can never write), or before any job: a hang
    returncode = None if stopped and (not job_started or "waiting for" in stderr) else process.returncode
    return classify(returncode, stderr, entry["key"], job_started), stderr


class _Launched(Exception):
    """Raised in place of Hydra's launch: the pre-check let the entry through."""


def run_in_process(entry: dict, fixtures: dict[str, str], scratch: Path) -> tuple[str, str]:
    """(outcome, stderr) of one entry through ``jensenkv.run.cli.main`` in this process, Hydra's launch replaced
    by a stub: what the pre-check alone does with it (``accepted``: it would start a job)."""
    import contextlib
    import io
    import traceback

    import jensenkv.run.summary
    from jensenkv.run.cli import main as run_main

    args, env = expand(entry, fixtures)
    cwd = scratch / entry["name"]
    cwd.mkdir(parents=True)
    saved_env, saved_argv, saved_launch = dict(os.environ), list(sys.argv), jensenkv.run.summary.run_with_summary
    os.environ.update({"WANDB_MODE": "disabled", "JENSENKV_RESULTS": str(cwd / "results"), **env})

    def launched(*args, **kwargs):
        raise _Launched

    jensenkv.run.summary.run_with_summary = launched
    stderr, code = io.StringIO(), None
    try:
        with contextlib.redirect_stderr(stderr):
            try:
                run_main(args)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except _Launched:
                return "accepted", stderr.getvalue()
            except Exception:  # noqa: BLE001 - what a user would see: a traceback
                traceback.print_exc()
                code = 1
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv[:] = saved_argv
        jensenkv.run.summary.run_with_summary = saved_launch
    return classify(code, stderr.getvalue(), entry["key"], job_started=False), stderr.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before an entry counts as a hang")
    parser.add_argument("--only", nargs="*", help="run only these entries (names)")
    parser.add_argument("--verbose", action="store_true", help="print the last stderr line of each entry")
    parser.add_argument("--subprocess", action="store_true",
                        help="run each entry as a real command (jobs included, minutes per entry) instead of the "
                             "pre-check in this process with Hydra's launch replaced (seconds for the table)")
    opts = parser.parse_args(argv)
    table = [e for e in load_table() if not opts.only or e["name"] in opts.only]
    counts: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="bad_inputs.") as tmp:
        fixtures = make_fixtures(Path(tmp) / "fixtures")
        for entry in table:
            outcome, stderr = (run_entry(entry, fixtures, Path(tmp) / "runs", opts.timeout) if opts.subprocess
                               else run_in_process(entry, fixtures, Path(tmp) / "runs"))
            counts[outcome] += 1
            last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
            print(f"{outcome:9} {entry['name']}" + (f"  | {last[:160]}" if opts.verbose else ""), flush=True)
        shutil.rmtree(Path(tmp) / "runs", ignore_errors=True)
    summary = ", ".join(f"{counts[o]} {o}" for o in OUTCOMES)
    print(f"{len(table)} bad inputs: {summary} (stopped = one line naming the key, exit 2, before any job)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
