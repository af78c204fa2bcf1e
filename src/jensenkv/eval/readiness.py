"""Which metrics and VBench dimensions can be computed here: the packages each one's code imports and the
weight files it reads (the paths ``eval.fidelity`` and ``eval.vbench`` use, which ``make fetch-weights`` fills),
and whether those files pass their checksum (``eval.checksums``), as the run will check them."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from jensenkv.readiness import Check, import_error, module_checks, require

# Modules each metric's code imports beyond the core (module, pip requirement).
METRIC_PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "psnr": (("torchmetrics", "torchmetrics"),),
    "ssim": (("torchmetrics", "torchmetrics"),),
    "lpips": (("lpips", "lpips"), ("torchvision", "torchvision")),
    "vbench": (("vbench", "vbench==0.1.5 (pip install --no-deps)"), ("decord", "decord")),
    "attention": (),
    "content": (),
}


def check_metric(metric: str, lpips_net: str = "alex", limits: Mapping[str, str] | None = None) -> Check:
    """One metric's packages and (for lpips) weight file; ``limits``: metrics the model cannot provide, with
    the reason (its family's ``metric_limits``). VBench's dimensions are checked one by one."""
    check = Check(f"metric {metric}", modules=module_checks(METRIC_PACKAGES.get(metric, ())))
    if metric not in METRIC_PACKAGES:
        check.notes.append(f"unknown metric {metric!r}: use one of {sorted(METRIC_PACKAGES)}")
    if metric == "lpips":
        from jensenkv.eval.fidelity import lpips_backbone_path

        path = lpips_backbone_path(lpips_net)
        check.files.append((path, path.is_file()))
        check.notes += untrusted_notes([path])
    if limits and metric in limits:
        check.notes.append(limits[metric])
    return check


def check_vbench_dimension(dimension: str) -> Check:
    """A dimension's weight files (VBench cache and torch hub), its scorer's modules and the scorer itself."""
    from jensenkv.eval.vbench import DIMENSION_PACKAGES, STANDARD_ONLY_DIMENSIONS, dimension_weight_paths

    check = Check(f"vbench {dimension}")
    if dimension in STANDARD_ONLY_DIMENSIONS:
        check.notes.append("VBench refuses it in custom_input mode (it needs VBench's standard prompt suite)")
        return check
    check.modules = module_checks(DIMENSION_PACKAGES.get(dimension, ()))
    if import_error("vbench") is None:
        check.modules += module_checks([(f"vbench.{dimension}", "vbench==0.1.5")])
    check.files = [(path, path.exists()) for path in dimension_weight_paths(dimension)]
    check.notes += untrusted_notes([path for path, present in check.files if present])
    return check


def untrusted_notes(paths: Sequence) -> list[str]:
    """The refusal line of each present file a loader would unpickle that fails its checksum
    (``jensenkv.eval.checksums``): what the run would record as the metric's reason."""
    from jensenkv.eval.checksums import untrusted_reason

    return [reason for path in paths if path.is_file() and (reason := untrusted_reason(path)) is not None]


def metric_checks(metrics: Sequence[str], vbench_dimensions: Sequence[str] = (), lpips_net: str = "alex",
                  limits: Mapping[str, str] | None = None) -> list[Check]:
    """Checks for the given metrics and (when "vbench" is one of them) VBench dimensions."""
    checks = [check_metric(m, lpips_net, limits) for m in dict.fromkeys(metrics)]
    if "vbench" in metrics:
        checks += [check_vbench_dimension(d) for d in dict.fromkeys(vbench_dimensions)]
    return checks


def require_ready(metrics: Sequence[str], vbench_dimensions: Sequence[str] = (), lpips_net: str = "alex") -> None:
    """Pre-flight check of a run: raise NotReadyError (one line: what is missing, what to do) unless every
    requested metric and VBench dimension can be computed."""
    require(metric_checks(metrics, vbench_dimensions, lpips_net))
