"""Readiness report: which models and metrics can run on this machine, and what is missing where.

    python -m jensenkv.doctor                       # every model config, the default metrics and dimensions
    python -m jensenkv.doctor --models tiny --metrics psnr lpips vbench --vbench-dims temporal_flickering
    make check-weights                              # the same as the first line
    python -m jensenkv.doctor --strict              # exit 1 when anything is missing (make check-weights STRICT=1)

For each model config (configs/model/*.yaml) and each metric / VBench dimension it prints ready or
missing, every file it looks for with the exact path (present or missing), and the Python modules the
code imports with whether they import; the last lines count what is ready and say what missing means. It is a
report: it exits 0 unless ``--strict`` (then 1 when anything is missing, for scripts). Nothing is downloaded: the
paths are the ones the consuming code reads (eval.vbench, eval.fidelity, the model loaders), and
``make fetch-weights`` fills exactly these.

The checks themselves are the families' (``jensenkv.models``: files and packages of each model) and the
evaluators' (``jensenkv.eval.readiness``); a run's pre-flight (``jensenkv.config.resolve``) reads the same ones.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jensenkv.exit_codes import EPILOG
from jensenkv.eval.readiness import METRIC_PACKAGES, check_metric, check_vbench_dimension, metric_checks  # noqa: F401
from jensenkv.models.registry import FAMILIES, family
from jensenkv.readiness import Check, NotReadyError, import_error, module_checks, require  # noqa: F401 - re-exported

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def model_configs(config_dir: Path = CONFIG_DIR) -> dict[str, dict]:
    """Every configs/model/*.yaml, resolved (``${oc.env:...}`` included)."""
    from omegaconf import OmegaConf

    return {p.stem: OmegaConf.to_container(OmegaConf.load(p), resolve=True)["model"]  # the preset's model node
            for p in sorted((config_dir / "model").glob("*.yaml"))}


def check_model(name: str, cfg: Mapping[str, Any]) -> Check:
    """The files the model's loader reads for this config, and its family's packages."""
    kind = cfg.get("kind")
    if kind not in FAMILIES:
        return Check(f"model {name}", notes=[f"model.kind={kind!r}: readiness is only known for kinds "
                                              f"{', '.join(FAMILIES)}"])
    own = family(kind)
    return Check(f"model {name}", files=own.files(own.view(cfg)), modules=module_checks(own.packages),
                 terms=own.terms(own.view(cfg)))


def readiness(metrics: Sequence[str], vbench_dimensions: Sequence[str] = (), lpips_net: str = "alex",
              models: Mapping[str, Mapping[str, Any]] | None = None) -> list[Check]:
    """Checks for the given models (name -> config), metrics and (when "vbench" is a metric) dimensions; the
    metrics one family cannot provide are named when every model is of that family."""
    models = dict(models or {})
    kinds = {cfg.get("kind") for cfg in models.values()}
    limits = family(kinds.pop()).metric_limits if len(kinds) == 1 and kinds <= set(FAMILIES) else None
    return [check_model(name, cfg) for name, cfg in models.items()] + \
        metric_checks(metrics, vbench_dimensions, lpips_net, limits)


def require_ready(metrics: Sequence[str], vbench_dimensions: Sequence[str] = (), lpips_net: str = "alex",
                  model: Mapping[str, Any] | None = None) -> None:
    """Raise NotReadyError (one line: what is missing, what to do) unless the model (a model config mapping,
    or None to skip it) and every requested metric and VBench dimension can run."""
    name = str((model or {}).get("name") or "model")
    require(readiness(metrics, vbench_dimensions, lpips_net, {name: model} if model else None))


def format_report(checks: Sequence[Check]) -> str:
    """The report: one header per check, then its files and modules, one per line."""
    lines = []
    for c in checks:
        lines.append(f"[{'ready' if c.ready else 'MISSING'}] {c.name}")
        lines += [f"    {'present' if ok else 'missing'}  {path}" for path, ok in c.files]
        lines += [f"    {'imports' if err is None else 'FAILS  '}  module {m}" + ("" if err is None else
                  f" ({err}; pip: {pip})") for m, pip, err in c.modules]
        lines += [f"    note     {n}" for n in c.notes]
        lines += [f"    licence  {t}" for t in c.terms]
        if not c.ready and c.fix():
            lines.append(f"    fix      {c.fix()}")
    ready = sum(c.ready for c in checks)
    lines.append(f"{ready} of {len(checks)} ready")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from omegaconf import OmegaConf

    from jensenkv.eval.vbench import ALL_DIMENSIONS

    from jensenkv.run import compose_config

    ev = OmegaConf.to_container(compose_config().eval, resolve=True)  # the default eval node, defaults included
    configs = model_configs()
    parser = argparse.ArgumentParser(prog="python -m jensenkv.doctor", description=__doc__.split("\n\n")[0],
                                     epilog=EPILOG + " (without --strict, missing weights exit 0)")
    parser.add_argument("--models", nargs="*", default=None, choices=sorted(configs),
                        help="model configs to check (default: all)")
    parser.add_argument("--metrics", nargs="*", default=None, choices=sorted(METRIC_PACKAGES),
                        help="default: the default run's eval.metrics")
    parser.add_argument("--vbench-dims", nargs="*", default=None, choices=list(ALL_DIMENSIONS),
                        help="default: the eval config's dimensions")
    parser.add_argument("--lpips-net", default=None, choices=("alex", "vgg", "squeeze"))
    parser.add_argument("--strict", action="store_true", help="exit 1 when anything is missing (default: exit 0)")
    args = parser.parse_args(argv)
    models = {n: configs[n] for n in (args.models if args.models is not None else configs)}
    metrics = args.metrics if args.metrics is not None else ev["metrics"]
    dims = args.vbench_dims if args.vbench_dims is not None else ev["vbench"]["dimensions"]
    checks = readiness(metrics, dims, args.lpips_net or ev["lpips"]["net"], None)
    from jensenkv.llm.weights import PRESETS, check as check_llm

    llms = [check_llm(preset) for preset in PRESETS] if args.models is None else []
    checks = [check_model(n, c) for n, c in models.items()] + llms + checks
    print(format_report(checks))
    missing = sum(not c.ready for c in checks)
    if missing:  # say what the exit status means: a missing model or metric is normal on a machine without weights
        print(f"{missing} missing: a run on a missing model stops before any work, a missing metric or dimension "
              f"is recorded missing with the reason; `make fetch-weights` on a machine with internet fetches "
              f"them (exit {1 if args.strict else 0}{'' if args.strict else '; --strict exits 1'})")
    return 1 if args.strict and missing else 0


if __name__ == "__main__":
    sys.exit(main())
