"""The README's commands, as written: every line of its ```bash blocks is checked without running anything heavy.

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
import re
import shlex
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
        from jensenkv.llm_config import compose

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
