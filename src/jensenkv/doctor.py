"""Readiness report: which models and metrics can run on this machine, and what is missing where.

    python -m jensenkv.doctor                       # every model config, the default metrics and dimensions
    python -m jensenkv.doctor --models tiny --metrics psnr lpips vbench --vbench-dims temporal_flickering
    make check-weights                              # the same as the first line

For each model config (configs/model/*.yaml) and each metric / VBench dimension it prints ready or
missing, every file it looks for with the exact path (present or missing), and the Python modules the
code imports with whether they import. Nothing is downloaded: the paths are the ones the consuming code
reads (eval.vbench, eval.fidelity, the model loaders), and ``make fetch-weights`` fills exactly these.

``require_ready`` is the pre-flight check for a run: it raises ``NotReadyError`` (one line, saying what
to do) when a requested metric or the model cannot run, before anything is generated.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
FETCH = "run `make fetch-weights` on a machine with internet (then copy the caches here if needed)"
SETUP = "run `make setup` (it installs VBench's scorer packages)"
# Modules each metric's code imports beyond the core (module, pip requirement).
METRIC_PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "psnr": (("torchmetrics", "torchmetrics"),),
    "ssim": (("torchmetrics", "torchmetrics"),),
    "lpips": (("lpips", "lpips"), ("torchvision", "torchvision")),
    "vbench": (("vbench", "vbench==0.1.5 (pip install --no-deps)"), ("decord", "decord")),
    "attention": (),
    "content": (),
}
MODEL_PACKAGES = {"tiny": (("safetensors", "safetensors"),),
                  "diffusers": (("diffusers", "diffusers"), ("transformers", "transformers")),
                  "magi": (("transformers", "transformers"), ("safetensors", "safetensors"))}


class NotReadyError(FileNotFoundError):
    """A requested model or metric cannot run here (weights or packages missing); the message says what to do."""


@dataclass
class Check:
    """The readiness of one model, metric or VBench dimension."""

    name: str  # e.g. "model skyreels_v2_df_1_3b", "metric lpips", "vbench subject_consistency"
    files: list[tuple[Path, bool]] = field(default_factory=list)  # (exact path looked in, present)
    modules: list[tuple[str, str, str | None]] = field(default_factory=list)  # (module, pip name, import error)
    notes: list[str] = field(default_factory=list)  # reasons that are neither a file nor a module

    @property
    def ready(self) -> bool:
        return all(ok for _, ok in self.files) and all(err is None for *_, err in self.modules) and not self.notes

    def problem(self) -> str:
        """What is wrong, in one clause ("" when ready)."""
        parts = [f"missing {path}" for path, ok in self.files if not ok]
        parts += [f"module {m} does not import ({pip}: {err})" for m, pip, err in self.modules if err is not None]
        return "; ".join(parts + self.notes)

    def fix(self) -> str:
        fixes = []
        if any(not ok for _, ok in self.files):
            fixes.append(FETCH)
        if any(err is not None for *_, err in self.modules):
            fixes.append(SETUP)
        return " and ".join(fixes)


def import_error(module: str) -> str | None:
    """None if ``module`` imports, else the error as one line."""
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any failure means the code that imports it cannot run
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def _modules(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str, str | None]]:
    return [(module, pip, import_error(module)) for module, pip in pairs]


def model_configs(config_dir: Path = CONFIG_DIR) -> dict[str, dict]:
    """Every configs/model/*.yaml, resolved (``${oc.env:...}`` included)."""
    from omegaconf import OmegaConf

    return {p.stem: OmegaConf.to_container(OmegaConf.load(p), resolve=True)["model"]  # the preset's model node
            for p in sorted((config_dir / "model").glob("*.yaml"))}


def check_model(name: str, cfg: Mapping[str, Any]) -> Check:
    """The files the model loader reads for this config, and its packages."""
    kind = cfg.get("kind")
    check = Check(f"model {name}", modules=_modules(MODEL_PACKAGES.get(kind, ())))
    if kind == "tiny":
        from jensenkv.models.tiny.config import CONFIG_FILE, WEIGHTS_DIR, WEIGHTS_FILE

        folder = Path(cfg.get("weights_dir") or WEIGHTS_DIR).expanduser()
        check.files += [(folder / f, (folder / f).is_file()) for f in (WEIGHTS_FILE, CONFIG_FILE)]
    elif kind == "diffusers":
        folder = _diffusers_folder(cfg, check)
        if folder is not None:
            sub = cfg.get("transformer_subfolder") or "transformer"
            for path in (folder / sub / "config.json", folder / "vae", folder / "tokenizer", folder / "text_encoder"):
                check.files.append((path, path.exists()))
        if cfg.get("transformer_checkpoint"):
            ckpt = Path(str(cfg["transformer_checkpoint"])).expanduser().resolve()
            check.files.append((ckpt, ckpt.is_file()))
    elif kind == "magi":
        if cfg.get("preset") != "tiny":  # the tiny preset is random-initialised: no files
            from jensenkv.models.magi.build import PRESET_VARIANTS

            folder = _diffusers_folder(cfg, check)
            variant = cfg.get("variant") or PRESET_VARIANTS.get(cfg.get("preset"), "?")
            if folder is not None:
                for path in (folder / "ckpt" / "magi" / variant, Path(cfg.get("t5_path") or folder / "ckpt" / "t5"),
                             Path(cfg.get("vae_path") or folder / "ckpt" / "vae")):
                    check.files.append((path, path.exists()))
            if cfg.get("special_tokens"):
                tokens = Path(str(cfg["special_tokens_file"])).expanduser()
                check.files.append((tokens, tokens.is_file()))
    else:
        check.notes.append(f"model.kind={kind!r}: readiness is only known for kinds tiny, diffusers and magi")
    return check


def _diffusers_folder(cfg: Mapping[str, Any], check: Check) -> Path | None:
    """The local folder the loader uses: ``path`` itself, or its snapshot in the Hugging Face cache."""
    from huggingface_hub import constants, snapshot_download

    path = str(cfg["path"])
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    cache = Path(cfg.get("cache_dir") or constants.HF_HUB_CACHE).expanduser()
    if local.is_absolute() or path.startswith((".", "~")) or path.count("/") != 1:
        check.files.append((local, False))
        return None
    try:
        return Path(snapshot_download(repo_id=path, cache_dir=str(cache), local_files_only=True))
    except Exception:  # noqa: BLE001 - not (fully) in the cache
        check.files.append((cache / f"models--{path.replace('/', '--')}", False))
        return None


def check_metric(metric: str, lpips_net: str = "alex", model_kind: str | None = None) -> Check:
    """One metric's packages and (for lpips) weight file; VBench's dimensions are checked one by one."""
    check = Check(f"metric {metric}", modules=_modules(METRIC_PACKAGES.get(metric, ())))
    if metric not in METRIC_PACKAGES:
        check.notes.append(f"unknown metric {metric!r}: use one of {sorted(METRIC_PACKAGES)}")
    if metric == "lpips":
        from jensenkv.eval.fidelity import lpips_backbone_path

        path = lpips_backbone_path(lpips_net)
        check.files.append((path, path.is_file()))
    if metric == "content" and model_kind not in (None, "tiny"):
        check.notes.append("content recovery reads the built-in model's videos only (model.kind=tiny)")
    return check


def check_vbench_dimension(dimension: str) -> Check:
    """A dimension's weight files (VBench cache and torch hub), its scorer's modules and the scorer itself."""
    from jensenkv.eval.vbench import DIMENSION_PACKAGES, STANDARD_ONLY_DIMENSIONS, dimension_weight_paths

    check = Check(f"vbench {dimension}")
    if dimension in STANDARD_ONLY_DIMENSIONS:
        check.notes.append("VBench refuses it in custom_input mode (it needs VBench's standard prompt suite)")
        return check
    check.modules = _modules(DIMENSION_PACKAGES.get(dimension, ()))
    if import_error("vbench") is None:
        check.modules += _modules([(f"vbench.{dimension}", "vbench==0.1.5")])
    check.files = [(path, path.exists()) for path in dimension_weight_paths(dimension)]
    return check


def readiness(metrics: Sequence[str], vbench_dimensions: Sequence[str] = (), lpips_net: str = "alex",
              models: Mapping[str, Mapping[str, Any]] | None = None) -> list[Check]:
    """Checks for the given models (name -> config), metrics and (when "vbench" is a metric) dimensions."""
    models = dict(models or {})
    kinds = {cfg.get("kind") for cfg in models.values()}
    kind = kinds.pop() if len(kinds) == 1 else None
    checks = [check_model(name, cfg) for name, cfg in models.items()]
    checks += [check_metric(m, lpips_net, kind) for m in dict.fromkeys(metrics)]
    if "vbench" in metrics:
        checks += [check_vbench_dimension(d) for d in dict.fromkeys(vbench_dimensions)]
    return checks


def require_ready(metrics: Sequence[str], vbench_dimensions: Sequence[str] = (), lpips_net: str = "alex",
                  model: Mapping[str, Any] | None = None) -> None:
    """Pre-flight check of a run: raise NotReadyError (one line: what is missing, what to do) unless the model
    (a model config mapping, or None to skip it) and every requested metric and VBench dimension can run."""
    name = str((model or {}).get("name") or "model")
    failed = [c for c in readiness(metrics, vbench_dimensions, lpips_net, {name: model} if model else None)
              if not c.ready]
    if failed:
        fixes = " and ".join(dict.fromkeys(f for c in failed for f in c.fix().split(" and ") if f))
        raise NotReadyError(
            "not ready: " + " | ".join(f"{c.name}: {c.problem()}" for c in failed)
            + f". To fix: {fixes or 'see the reasons'}; or drop them from eval.metrics / eval.vbench.dimensions."
            " `make check-weights` lists every path")


def format_report(checks: Sequence[Check]) -> str:
    """The report: one header per check, then its files and modules, one per line."""
    lines = []
    for c in checks:
        lines.append(f"[{'ready' if c.ready else 'MISSING'}] {c.name}")
        lines += [f"    {'present' if ok else 'missing'}  {path}" for path, ok in c.files]
        lines += [f"    {'imports' if err is None else 'FAILS  '}  module {m}" + ("" if err is None else
                  f" ({err}; pip: {pip})") for m, pip, err in c.modules]
        lines += [f"    note     {n}" for n in c.notes]
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
    parser = argparse.ArgumentParser(prog="python -m jensenkv.doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=None, choices=sorted(configs),
                        help="model configs to check (default: all)")
    parser.add_argument("--metrics", nargs="*", default=None, choices=sorted(METRIC_PACKAGES),
                        help="default: the default run's eval.metrics")
    parser.add_argument("--vbench-dims", nargs="*", default=None, choices=list(ALL_DIMENSIONS),
                        help="default: the eval config's dimensions")
    parser.add_argument("--lpips-net", default=None, choices=("alex", "vgg", "squeeze"))
    args = parser.parse_args(argv)
    models = {n: configs[n] for n in (args.models if args.models is not None else configs)}
    metrics = args.metrics if args.metrics is not None else ev["metrics"]
    dims = args.vbench_dims if args.vbench_dims is not None else ev["vbench"]["dimensions"]
    checks = readiness(metrics, dims, args.lpips_net or ev["lpips"]["net"], None)
    checks = [check_model(n, c) for n, c in models.items()] + checks
    print(format_report(checks))
    return 0 if all(c.ready for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
