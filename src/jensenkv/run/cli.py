"""Command line: ``python -m jensenkv.run [overrides]`` (Hydra), plus the compose-API entry for notebooks/tests.

Before Hydra launches anything, every swept value is composed and validated once (``precheck``), so a bad
value in a sweep stops it with one line before the first job starts, and Hydra's multi-line composition
errors (unknown group option or key, bad override syntax) become one line too.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jensenkv.run.runner import Runner
from jensenkv.checks import fail
from jensenkv.config.resolve import CONFIG_DIR, CONFIG_GROUPS, build_spec, compose_config


def preset(*overrides: str) -> Any:
    """The validated config tree (RunConfig) of ``overrides`` composed on configs/: how scripts, benchmarks and
    notebooks get a preset, so a label (``quant=rtn``, ``model=tiny``) means the same thing everywhere."""
    return build_spec(compose_config(overrides))


def run_overrides(overrides: Sequence[str] = ()) -> dict:
    """Run one configuration in this process (notebooks, tests) and return its record."""
    return Runner(build_spec(compose_config(overrides))).run()


def group_options(group: str, config_dir: Path = CONFIG_DIR) -> list[str]:
    return sorted(p.stem for p in (config_dir / group).glob("*.yaml"))


def check_group_overrides(args: Sequence[str], config_dir: Path = CONFIG_DIR) -> None:
    """Raise ValueError for `group=option` overrides (sweeps included) naming an option that does not exist."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    candidates = [a for a in args if not a.startswith("-") and "=" in a]
    try:
        overrides = OverridesParser.create().parse_overrides(candidates)
    except Exception:  # noqa: BLE001 - malformed overrides: Hydra reports them itself
        return
    for override in overrides:
        group = override.key_or_group
        if group not in CONFIG_GROUPS or override.package is not None or override.is_delete():
            continue
        allowed = group_options(group, config_dir)
        values = (_sweep_values(override, allowed) if override.is_sweep_override()
                  else [override.get_value_element_as_str()])
        for value in values:
            if value not in allowed and not (group == "experiment" and value == "null"):
                fail(group, value, f"choose one of {allowed}")


def run_command(overrides: Sequence[str], work: Callable[[], Any]) -> None:
    """A command line's body for Hydra overrides (calibrate, noise floor): check the group overrides, run
    ``work`` and print what it returns; bad input is one line on stderr and exit 2."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from jensenkv.exit_codes import guarded

    def body() -> None:
        try:
            check_group_overrides(list(overrides))
            result = work()
        except (HydraException, OmegaConfBaseException) as e:
            print(f"error: {_one_line(e)}", file=sys.stderr)
            sys.exit(2)
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        print(result)

    guarded(body)


def _one_line(error: Exception) -> str:
    """A Hydra composition error as one line (its message minus the search-path dump); for an unknown key,
    the keys that do exist there."""
    import re

    text = str(error).split("Config search path:")[0]
    line = " ".join(part.strip() for part in text.splitlines() if part.strip())
    unknown = re.match(r"Could not override '([\w.]+)'", line)
    cause = error.__cause__
    if not unknown and cause is not None and "full_key:" in str(cause):  # a typed field refused the value
        from jensenkv.config.resolve import field_error_line as field_error

        return f"{line}: {field_error(cause)}"
    if unknown:
        key = unknown.group(1)
        parent, _, name = key.rpartition(".")
        try:
            from omegaconf import OmegaConf

            root = compose_config()
            node = OmegaConf.select(root, parent) if parent else root
            if node is None:  # the parent itself is not a node: list the top-level keys
                parent, node = "", root
            allowed = sorted(k for k in node.keys() if k != "hydra")
        except Exception:  # noqa: BLE001 - the hint is a courtesy; the error stands without it
            return line
        return (f"{key} is not allowed: {parent or 'the config'} has no key {name!r}; allowed keys: {allowed} "
                f"(to add a new key use +{key}=...)")
    return line


def sweep_variants(args: Sequence[str]) -> list[list[str]] | None:
    """Every value of every swept key, each in one override list (the other sweeps at their first value):
    enough to check each value once without expanding the product. Sweeps declared in the config
    (``hydra.sweeper.params``, e.g. experiment files) are included; command-line ones win.
    None when the arguments are not plain overrides (--cfg, --help, ...: Hydra's business)."""
    return _sweep_plan(args)[1]


def _sweep_plan(args: Sequence[str]) -> tuple[Any, list[list[str]] | None]:
    """(the config composed from the non-swept overrides with its hydra node, ``sweep_variants``); (None, None)
    when the arguments are not plain overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in args):
        return None, None
    plain = [a for a in args if not a.startswith("-")]
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(plain)
    base = compose_config([o.input_line for o in parsed if not o.is_sweep_override()], hydra_config=True)
    params = base.hydra.sweeper.get("params") or {}
    declared = parser.parse_overrides([f"{k}={v}" for k, v in params.items()])
    by_key = {o.key_or_group: o for o in [*declared, *parsed]}  # command line last: it wins
    fixed = [o.input_line for o in by_key.values() if not o.is_sweep_override()]
    sweeps: dict[str, list[str]] = {}
    for key, override in by_key.items():
        if override.is_sweep_override():
            sweeps[key] = _sweep_values(override)
    first = [f"{k}={v[0]}" for k, v in sweeps.items()]
    variants = [fixed + first]
    for key, values in sweeps.items():
        for value in values[1:]:
            variants.append(fixed + [f"{k}={values[0] if k != key else value}" for k, values in sweeps.items()])
    return base, variants


def _sweep_values(override: Any, options: list[str] | None = None) -> list[str]:
    """The values a basic-sweeper sweep takes, as override strings: lists, choice(), range(), shuffle(), sort(),
    and glob() over a config group's options (``options``, default: the group's files). ValueError for an interval() sweep, which only an optimizing
    sweeper can sample."""
    from hydra.core.override_parser.types import Glob, IntervalSweep

    value = override.value()
    if isinstance(value, Glob):
        if override.key_or_group not in CONFIG_GROUPS:
            raise ValueError(f"{override.input_line}: glob() sweeps config group options; "
                             f"{override.key_or_group} is not a group (groups: {', '.join(CONFIG_GROUPS)})")
        chosen = value.filter(group_options(override.key_or_group) if options is None else options)
        if not chosen:
            raise ValueError(f"{override.input_line}: glob() matches none of the {override.key_or_group} options "
                             f"{group_options(override.key_or_group) if options is None else options}")
        return chosen
    if isinstance(value, IntervalSweep):
        raise ValueError(f"{override.input_line}: interval() needs an optimizing sweeper (e.g. Optuna); this "
                         "suite's basic sweeper takes a list, choice() or range()")
    return list(override.sweep_string_iterator())


def precheck(args: Sequence[str]) -> None:
    """Compose and validate every swept value before Hydra starts any job: one line for any bad value.

    Also checked here, once: the environment variables the runs read, the override syntax (naming the
    override), keys added with ``+`` (the schema has every key), the launcher (a multirun's), and each
    variant's results dir (a folder that can be written, so no job waits on a lock it can never take).
    Raises ValueError (bad group option, unknown key, bad value, bad override syntax)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from jensenkv.run.slurm_resources import planned_node_of

    check_environment()
    check_override_syntax(args)
    check_group_overrides(args)
    check_added_keys(args)
    try:
        base, variants = _sweep_plan(args)
        multirun = "-m" in args or "--multirun" in args
        if base is not None:
            check_launcher(base.hydra, multirun=multirun)
        checked: set[str] = set()
        plain = [a for a in args if not a.startswith("-")]
        for overrides in variants or []:
            # without sweeps the one variant is the base config already composed (composing is the slow part)
            with planned_node_of(_jobs_launcher(base, multirun)):  # devices checked as on the jobs' node
                spec = build_spec(base if overrides == plain else compose_config(overrides))
            for key, folder in _written_dirs(spec):
                if folder not in checked:
                    check_writable_dir(folder, key)
                    checked.add(folder)
    except (HydraException, OmegaConfBaseException) as e:
        raise ValueError(_one_line(e)) from None
    except AssertionError:  # OmegaConf asserts when an override reaches into a null node
        raise ValueError(_null_parent(args)) from None


def _jobs_launcher(base: Any, multirun: bool) -> Any:
    """The launcher that runs the jobs (None: they run here, as a single run does whatever the launcher)."""
    if base is None or not (multirun or "MULTIRUN" in str(base.hydra.get("mode"))):
        return None
    return base.hydra.get("launcher")


def check_environment() -> None:
    """The environment variables a run reads, checked before any job (each names itself in the error)."""
    from jensenkv.config.logger import resolve_wandb_mode
    from jensenkv.store.lock import lock_stale_after_s

    lock_stale_after_s()  # JENSENKV_LOCK_STALE_S
    resolve_wandb_mode("offline")  # WANDB_MODE, which wins over logger.mode


def check_override_syntax(args: Sequence[str]) -> None:
    """Raise ValueError naming the first override Hydra's grammar cannot parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for arg in (a for a in args if not a.startswith("-")):
        try:
            parser.parse_override(arg)
        except HydraException as e:
            reason = " ".join(str(e).split("See https://")[0].split())
            raise ValueError(f"override {arg!r} cannot be parsed ({reason}); quote values with spaces or "
                             "brackets, see https://hydra.cc/docs/advanced/override_grammar/basic") from None


def check_added_keys(args: Sequence[str]) -> None:
    """``+key=value`` may add a key only where the schema has free mappings (``model.model_overrides``,
    ``hydra.*``): every other key is in the schema already, so an added one is a typo, refused like
    ``key=value`` for an unknown key."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from jensenkv.config.resolve import unknown_schema_key

    for override in OverridesParser.create().parse_overrides([a for a in args if not a.startswith("-")]):
        key = override.key_or_group
        if not override.is_add() or key.startswith("hydra") or "/" in key or key in CONFIG_GROUPS:
            continue
        unknown = unknown_schema_key(key)
        if unknown is not None:
            parent, name, allowed = unknown
            raise ValueError(f"+{key} is not allowed: {parent or 'the config'} has no key {name!r}; "
                             f"allowed keys: {allowed}")


def check_launcher(hydra_node: Any, multirun: bool) -> None:
    """A multirun's launcher settings that would otherwise fail after Hydra started: joblib's n_jobs, SLURM
    (submitit) on a machine without it, and jobs the scheduler would refuse (``sbatch --test-only``)."""
    import shutil

    from jensenkv.checks import is_int

    multirun = multirun or "MULTIRUN" in str(hydra_node.get("mode"))
    launcher = hydra_node.get("launcher") or {}
    if not multirun:  # a single run ignores the launcher
        return
    if "n_jobs" in launcher and (not is_int(launcher.n_jobs) or launcher.n_jobs == 0):
        fail("hydra.launcher.n_jobs", launcher.n_jobs, "a non-zero integer: jobs run at once (-1: every core)")
    from jensenkv.run.slurm_resources import check_time_limit, is_slurm

    if is_slurm(launcher):
        check_time_limit(launcher)
        if shutil.which("srun") is None or shutil.which("sbatch") is None:
            fail("hydra/launcher", hydra_node.runtime.choices.get("hydra/launcher", "slurm"),
                 "SLURM is not installed here (no srun or sbatch on PATH): run it on the cluster's login node, or "
                 "use hydra/launcher=local_parallel")
        from omegaconf import OmegaConf

        from jensenkv.run.slurm_check import check_slurm_accepts

        check_slurm_accepts(OmegaConf.to_container(launcher, resolve=True))  # the scheduler's own answer


def _written_dirs(spec: Any) -> list[tuple[str, str]]:
    """(key, folder) of every folder a run writes: the results dir and, when W&B logs, its folder (WANDB_DIR
    in the environment wins, as in ``runner.run_environment``)."""
    import os

    from jensenkv.config.logger import resolve_wandb_mode

    folders = [("paths.results_dir", spec.paths.results_dir)]
    if resolve_wandb_mode(spec.logger.mode) != "disabled":
        folders.append(("WANDB_DIR", os.environ["WANDB_DIR"]) if os.environ.get("WANDB_DIR") else
                       ("logger.dir", spec.logger.dir or str(Path(spec.paths.results_dir) / "wandb")))
    return folders


def check_writable_dir(folder: str, key: str = "paths.results_dir") -> None:
    """A folder a run writes must be one this process can create and write: refused now, not in a job that
    would wait on a lock it can never take, or retry a W&B log that can never succeed."""
    import os

    from jensenkv.store.files import describe_write_error, probe_writable

    try:
        probe_writable(Path(folder).expanduser())
    except OSError as e:
        source = " (set by JENSENKV_RESULTS)" if key == "paths.results_dir" and \
            os.environ.get("JENSENKV_RESULTS") == folder else ""
        raise ValueError(describe_write_error(e, folder, key) + source) from None


def _null_parent(args: Sequence[str]) -> str:
    """The override that sets a field under a node that is null in this config (e.g. generation.magi.* on a
    model that is not MAGI-1), as one line."""
    from omegaconf import OmegaConf

    plain = [a for a in args if not a.startswith("-") and "=" in a]
    for arg in plain:
        key = arg.split("=", 1)[0].lstrip("+~")
        parent = key.rpartition(".")[0]
        if parent.count(".") < 1:
            continue
        others = [a for a in plain if a != arg and "," not in a]
        if OmegaConf.select(compose_config(others), parent) is None:
            return f"{key} is not allowed: {parent} is null for this model (it only exists where a preset sets it)"
    return f"an override sets a field under a null node: {' '.join(plain)}"


def task(cfg: Any) -> dict | None:
    """Hydra task: validate (one-line error, exit 2), then run (bad input found later: one line, exit 3).

    Set JENSENKV_DEBUG=1 to get the traceback instead.
    """
    import logging
    import os

    from jensenkv.run.orphans import stop_with_sweep
    from jensenkv.store.lock import LockError

    logging.raiseExceptions = False  # a log file on a full disk: no "--- Logging error ---" tracebacks
    stop_with_sweep()  # a parallel worker ends with its sweep
    try:
        spec = build_spec(cfg)
    except (ValueError, FileNotFoundError) as e:  # bad value, missing weights: before any work
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        return Runner(spec).run()
    except LockError as e:  # a lock that can never be taken: before any work, like a bad value
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (ValueError, FileNotFoundError) as e:  # bad input, missing weights, damaged results: say what, where
        if os.environ.get("JENSENKV_DEBUG"):
            raise
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(3)


def with_family_resources(args: Sequence[str]) -> list[str]:
    """``args`` plus the SLURM resources the model's family states, for those the command line does not set
    (``jensenkv.run.slurm_resources``): the pre-check's ``sbatch --test-only`` then judges the jobs' own
    request. Unchanged for other launchers."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from jensenkv.run.slurm_resources import resource_overrides

    try:
        base, variants = _sweep_plan(args)
    except (HydraException, OmegaConfBaseException, ValueError, AssertionError):  # the pre-check names it
        return list(args)
    return [*args, *resource_overrides(args, base, variants)]


HELP_FLAGS = {"--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion", "-sc"}


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry: check every (swept) value, then hand over to Hydra."""
    import logging

    import hydra

    logging.raiseExceptions = False  # a log file on a full disk: no "--- Logging error ---" tracebacks
    args = list(sys.argv[1:] if argv is None else argv)
    if HELP_FLAGS & set(args):  # Hydra prints the help and runs nothing: no value needs checking
        sys.argv = [sys.argv[0], *args]
        hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")(task)()
        return
    try:
        args = with_family_resources(args)
        precheck(args)
    except (ValueError, FileNotFoundError) as e:  # checked before Hydra starts any job
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C while checking: nothing has started, nothing to summarise
        print("interrupted: before any job started (while checking the values)", file=sys.stderr)
        sys.exit(130)
    sys.argv = [sys.argv[0], *args]
    from jensenkv.run import loading
    from jensenkv.run.summary import run_with_summary  # done / skipped / failed / missing; non-zero if missing

    loading.release()  # from here Ctrl-C is the runs' own: one line, the summary, and the rerun resumes

    run_with_summary(args, hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")(task))
