"""The README's commands, as written: every line of its ```bash blocks is checked without running anything heavy,
and every one that can run on a CPU without downloaded weights is run for real (``PLANS`` says, for each, how it
runs here or why not: weights, a GPU, too long and what covers it).

- ``make X``: X is a Makefile target.
- ``source <venv>/bin/activate``: the venv `make setup` creates, said before the first ``python -m`` line.
- ``python -m M ARGS``: M imports; ``jensenkv.run``'s Hydra overrides pass the pre-check (``run.cli.precheck``,
  no job), every value swept on the line included; the values an experiment file sweeps are the same in every
  command and are checked job by job in tests/test_configs.py, so here only their first values are. Another
  module's arguments pass its own argparse parser (and any Hydra overrides among them the pre-check). A
  real-model line stops, with an empty Hugging Face cache, with the one-line missing-weights error naming the
  file, exit 2, no traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def bash_commands(text: str) -> dict[str, str]:
    """Every command of the ```bash blocks (backslash continuations joined) -> its comment."""
    commands: dict[str, str] = {}
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        pending = ""
        for line in block.splitlines():
            line = pending + line
            pending = ""
            if line.rstrip().endswith("\\"):
                pending = line.rstrip()[:-1] + " "
                continue
            words = shlex.split(line, comments=True)
            if words:
                commands[shlex.join(words)] = line.split(" #", 1)[1] if " #" in line else ""
    return commands


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z0-9_-]+):", (ROOT / "Makefile").read_text(), flags=re.M))


def makefile_venv() -> str:
    return re.search(r"^VENV := (\S+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)


COMMENTS = bash_commands(README.read_text())
COMMANDS = list(COMMENTS)
PYTHON_COMMANDS = [c for c in COMMANDS if c.startswith("python -m ")]


def test_the_readme_has_commands_of_every_kind_and_no_other():
    assert any(c.startswith("make ") for c in COMMANDS) and len(PYTHON_COMMANDS) >= 10
    unknown = [c for c in COMMANDS if not c.startswith(("make ", "python -m ", "source "))]
    assert unknown == [], "extend tests/test_readme_commands.py to check these README commands"


def test_every_make_target_exists_and_activation_comes_first():
    targets = makefile_targets()
    for command in (c for c in COMMANDS if c.startswith("make ")):
        target = shlex.split(command)[1]
        assert target in targets, f"README runs `{command}`, but the Makefile has no target {target!r}"
    sources = [i for i, c in enumerate(COMMANDS) if c.startswith("source ")]
    assert sources, "the README must say once to activate .venv before `python -m ...`"
    assert COMMANDS[sources[0]] == f"source {makefile_venv()}/bin/activate"
    assert sources[0] < COMMANDS.index(PYTHON_COMMANDS[0])


class _Parsed(Exception):
    """Raised in place of running a module once its argument parser has parsed the README's arguments."""


def _parse_only(module: str, args: list[str], monkeypatch) -> argparse.Namespace:
    """The namespace the module's own parser makes of ``args`` (argparse errors fail the test)."""
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, argv=None, namespace=None):
        raise _Parsed(real(self, argv, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    with pytest.raises(_Parsed) as parsed:
        importlib.import_module(module).main(args)
    monkeypatch.undo()
    return parsed.value.args[0]


@pytest.fixture
def no_hub_weights(tmp_path, monkeypatch):
    """An empty Hugging Face cache and no MAGI-1 special tokens: real-model lines must stop before any work."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("MAGI_SPECIAL_TOKENS", str(tmp_path / "special_tokens.npz"))
    monkeypatch.delenv("JENSENKV_RESULTS", raising=False)


def _stops_with_missing_weights(args: list[str], error: Exception, capsys, monkeypatch) -> str:
    """The entry point, its pre-check raising ``error`` again (it was just computed): exit 2 with one line, before
    Hydra starts any job, no traceback."""
    import jensenkv.run.cli as cli

    def precheck_again(_args):
        raise error

    monkeypatch.setattr(cli, "precheck", precheck_again)
    import jensenkv.run.summary

    def no_jobs(*args, **kwargs):
        raise AssertionError("Hydra was started after a failed pre-check")

    monkeypatch.setattr(jensenkv.run.summary, "run_with_summary", no_jobs)
    with pytest.raises(SystemExit) as stop:
        cli.main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert stop.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _line_sweeps_only(monkeypatch) -> None:
    """The pre-check's variants limited to the first one and those that change a key swept on the command line
    (an experiment file's own sweep values: tests/test_configs.py)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    import jensenkv.run.cli as cli

    real = cli.sweep_variants

    def variants(args):
        every = real(args)
        parsed = OverridesParser.create().parse_overrides([a for a in args if not a.startswith("-")])
        swept = {o.key_or_group for o in parsed if o.is_sweep_override()}
        first = set(every[0])
        return every[:1] + [v for v in every[1:] if {o.split("=", 1)[0] for o in set(v) - first} <= swept]

    monkeypatch.setattr(cli, "sweep_variants", variants)


@pytest.mark.parametrize("command", PYTHON_COMMANDS)
def test_python_commands_pass_the_precheck_or_stop_on_missing_weights(command, no_hub_weights, monkeypatch, capsys):
    from jensenkv.run.cli import precheck

    _line_sweeps_only(monkeypatch)
    module, *args = shlex.split(command)[2:]
    assert importlib.util.find_spec(module) is not None, f"`{command}`: no module {module}"
    if module == "jensenkv.run.llm_prefill":  # its own config tree (configs/llm): composed and checked, not run
        from jensenkv.config.llm import compose

        compose(_parse_only(module, args, monkeypatch).settings)
        return
    if module != "jensenkv.run":
        overrides = getattr(_parse_only(module, args, monkeypatch), "overrides", None)
        if overrides:
            precheck(overrides)
        return
    comment = COMMENTS[command]
    try:
        precheck(args)
    except FileNotFoundError as e:  # a real model without its files: the command line says so in one line, exit 2
        line = _stops_with_missing_weights(args, e, capsys, monkeypatch)
        assert line.startswith("error: ") and "make fetch-weights" in line and ("/" in line or "model.path" in line)
        assert "weights" in comment, f"`{command}` needs weights its README comment does not mention: {line}"
        return
    except ValueError as e:  # SLURM where no srun exists or no controller answers: refused in the pre-check
        if "hydra/launcher=slurm" not in args or not any(w in str(e) for w in ("srun", "sbatch")):
            raise
        return
    assert "(weights" not in comment, f"`{command}` is said to need weights but passes without them"


# --- every command, run for real where it can run here ----------------------------------------------------------
@dataclass(frozen=True)
class Runs:
    """A command that runs here: as written, plus ``extra`` (one prompt, where the line allows it), in a temporary
    results dir (JENSENKV_RESULTS); ``argv`` replaces a make line by the command its target runs (without
    ``make setup``); ``after``: the command whose store it reads; ``done``: the runs the summary must count done."""

    extra: tuple[str, ...] = ()
    argv: tuple[str, ...] | None = None
    after: str | None = None
    done: int | None = None
    slow: bool = False


@dataclass(frozen=True)
class NotHere:
    """A command that does not run here, and why (needs weights, needs a GPU, too long: covered by ...)."""

    why: str


ONE_PROMPT = ("eval.num_prompts=1",)
RUN = "python -m jensenkv.run quant.bits=2 correction=taylor"
LLM_SMOKE = "python -m jensenkv.run.llm_prefill experiment=llm_smoke"
PLANS: dict[str, Runs | NotHere] = {
    "make reproduce-table1": NotHere("too long (about 15 min): covered by the run and report lines below and "
                                     "tests/models/test_family_kit.py (run, store check, table1, claims, rerun)"),
    "make reproduce-llm": NotHere(f"too long (about 30 min): covered by `{LLM_SMOKE}` and the report line below"),
    "make test": NotHere("this suite itself"),
    "source .venv/bin/activate": NotHere("a shell's activation: the runs below use this interpreter"),
    "make notebooks": NotHere("starts JupyterLab and waits: covered by tests/test_notebooks.py"),
    RUN: Runs(ONE_PROMPT, done=1),
    "python -m jensenkv.run generation.window_size=2 'generation.kv_range=[4,3,2,1]'": Runs(ONE_PROMPT, done=1),
    "python -m jensenkv.run -m quant.bits=2,4 quant.group_size=32,64,128 quant.rotation=none,hadamard "
    "correction=none,taylor,exact": Runs(ONE_PROMPT, slow=True),
    "python -m jensenkv.run -m experiment=tradeoff hydra/launcher=local_parallel": Runs(ONE_PROMPT, slow=True),
    "python -m jensenkv.run -m experiment=table1 hydra/launcher=slurm": NotHere(
        "needs a SLURM cluster: its jobs are those of `make reproduce-table1`, its pre-check is tested above"),
    "python -m jensenkv.run -m experiment=table1_skyreels": NotHere("needs weights (SkyReels-V2): its family is "
                                                                    "covered by tests/models/test_family_kit.py"),
    "python -m jensenkv.run -m experiment=table1_magi1": NotHere("needs weights and a GPU (MAGI-1 4.5B): covered "
                                                                 "by `python -m jensenkv.run model=magi1_tiny`"),
    "python -m jensenkv.run model=magi1_tiny": Runs(ONE_PROMPT, done=1),
    "python -m jensenkv.run model=worldplay_tiny quant.bits=2 correction=taylor": Runs(ONE_PROMPT, done=1),
    "python -m jensenkv.run -m experiment=table1_worldplay": NotHere(
        "needs weights, images and a GPU (HY-WorldPlay 8B): covered by the worldplay_tiny line"),
    "python -m jensenkv.report.table1": Runs(after=RUN),
    "python -m jensenkv.report.videos": Runs(after=RUN),
    "python -m jensenkv.run.llm_prefill experiment=llm_prefill": NotHere(
        f"too long (10 runs x 64 windows, about 30 min): covered by `{LLM_SMOKE}`"),
    "python -m jensenkv.report.llm_prefill": Runs(after=LLM_SMOKE, slow=True),
    LLM_SMOKE: Runs(slow=True),
    "python -m jensenkv.run.llm_prefill llm.name=llama3_1_8b llm.dtype=bfloat16 llm.device=cuda": NotHere(
        "needs weights and a GPU (Llama 3.1 8B): covered by the llm_smoke line (SmolLM2-135M)"),
    "make fetch-weights": NotHere("needs the internet: covered by tests/test_fetch_weights.py"),
    "make check-weights": Runs(argv=("python", "-m", "jensenkv.doctor")),
    "make gpu-wheels": NotHere("needs the package registry: covered by tests/test_gpu_check.py (the wheel list)"),
    "make gpu-check": NotHere("needs a GPU: its dry run is the next line"),
    "make gpu-check-dry-run": NotHere("minutes of TRITON_INTERPRET: covered by tests/test_gpu_check.py "
                                      "(test_gpu_check_full_dry_run runs every group)"),
}
FAILED_OR_TRACEBACK = re.compile(r"Traceback|\bfailed: unexpected error")
SWEEP_SUMMARY = re.compile(r"summary: (\d+) run\(s\): (\d+) done, (\d+) skipped \(already finished\), (\d+) "
                           r"failed, (\d+) missing")


def test_every_readme_command_says_how_it_runs_here():
    unplanned = [c for c in COMMANDS if c not in PLANS]
    assert not unplanned, f"say in PLANS how these README commands run here, or why not: {unplanned}"
    assert not set(PLANS) - set(COMMANDS), f"PLANS names commands the README no longer has: {set(PLANS) - set(COMMANDS)}"
    for command, plan in PLANS.items():
        assert isinstance(plan, Runs) or plan.why, command


@pytest.fixture(scope="module")
def readme_runs(tmp_path_factory):
    """Each runnable README command run once (and what it reads first), in one temporary results dir."""
    root = tmp_path_factory.mktemp("readme")
    env = {**os.environ, "JENSENKV_RESULTS": str(root / "results"), "PYTHONPATH": str(ROOT / "src"),
           "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("JENSENKV_DEBUG", None)
    ran: dict[str, subprocess.CompletedProcess] = {}

    def run(command: str) -> subprocess.CompletedProcess:
        plan = PLANS[command]
        if command not in ran:
            if plan.after:
                run(plan.after)
            words = list(plan.argv or shlex.split(command))
            assert words[0] == "python", command
            ran[command] = subprocess.run([sys.executable, *words[1:], *plan.extra], cwd=root, env=env,
                                          capture_output=True, text=True, timeout=1800)
        return ran[command]

    return run


def _plan_params():
    return [pytest.param(c, id=c.removeprefix("python -m "),
                         marks=[pytest.mark.slow] if PLANS[c].slow else [])
            for c in COMMANDS if isinstance(PLANS.get(c), Runs)]


@pytest.mark.parametrize("command", _plan_params())
def test_the_command_runs_here_and_nothing_fails(command, readme_runs):
    plan = PLANS[command]
    proc = readme_runs(command)
    output = proc.stdout + proc.stderr
    assert not FAILED_OR_TRACEBACK.search(output), output[-4000:]
    module = (plan.argv or shlex.split(command))[2]
    if module.startswith("jensenkv.report."):  # a report of a store that is not all of Table 1: done or partial
        assert proc.returncode in (0, 1), output[-4000:]
        return
    assert proc.returncode == 0, output[-4000:]
    if module == "jensenkv.run":
        summaries = SWEEP_SUMMARY.findall(proc.stderr)
        assert summaries, f"no summary line: {output[-3000:]}"
        runs, done, skipped, failed, missing = map(int, summaries[-1])
        assert failed == 0 and missing == 0 and done + skipped == runs, summaries[-1]
        if plan.done is not None:
            assert done == plan.done, f"`{command}` ended {summaries[-1]}, not {plan.done} done"
