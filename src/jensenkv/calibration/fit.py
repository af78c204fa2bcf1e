"""``python -m jensenkv.calibration``: fit signed per-(layer, head) correction strengths on calibration prompts.

    python -m jensenkv.calibration quant=rtn correction=taylor            # eval=calibration by default
    python -m jensenkv.calibration quant=rtn correction=taylor --name rtn-int2-g32 --out my/strengths.json
    python -m jensenkv.run quant=rtn correction=taylor attention.calibration=results/calibration/rtn-int2-g32.json

The same Hydra config as ``jensenkv.run`` (configs/config.yaml), with ``eval=calibration`` unless an ``eval=``
override says otherwise: prompts disjoint from eval=default, so strengths are judged on prompts they never saw
(a run refuses a file whose prompts overlap its own).

Each (prompt, seed) is generated with the run's quantized cache and correction; every layer is probed at the
configured denoising steps (attention.probe_steps) with ``attention.head_moments`` on, which records per head
(jensenkv.attention.diagnostics.head_shift_moments), for each query, the realized shift of the cached
log-partition delta = log Z_S(k_hat) - log Z_S(k) (dequantized vs full-precision keys, both without bias) and
the correction's bias averaged under the dequantized softmax over cached keys <b>. Subtracting s * b lowers
log Z_S(k_hat) by s * <b> to first order, so the strength that cancels the shift is the least-squares slope

    s_{l,h} = argmin_s sum (delta - s <b>)^2 = sum <b> delta / sum <b>^2   over probed steps, chunks, branches, queries

signed: negative when the first-order shift (e.g. RTN's integer zero point) lowers log Z_S more than the Jensen
term raises it. Its standard error is cluster-robust with one cluster per video (queries of one video are not
independent); with few videos the 95% interval uses Student's t with (videos - 1) degrees of freedom (8 videos:
t = 2.36, where 1.96 would cover only about 0.88). Entries without signal (sum <b>^2 = 0) keep strength 1.

``--shrink TARGET`` writes strengths shrunk toward TARGET by their standard error (1: the correction as derived;
0: no correction): s' = TARGET + w (s - TARGET) with w = d^2 / (d^2 + SE^2), d = s - TARGET, the posterior mean
under a normal prior on s centred at TARGET whose variance is estimated by d^2; an entry without a standard error
is set to TARGET. The fitted strengths stay in the file under ``fit``; the file's digest (so the run ids) differs.

Calibration seeds must be disjoint from the evaluation seeds (eval=calibration uses seed 1000; a run refuses a file
whose seeds overlap its own), as its prompts already are.

The file (jensenkv.calibration, written atomically) goes to ``<paths.results_dir>/calibration/<name>.json``.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import math
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from jensenkv.attention.diagnostics import HEAD_MOMENT_KEYS
from jensenkv.exit_codes import EPILOG

log = logging.getLogger("jensenkv.calibration")
OBJECTIVE = ("least squares per (layer, head): s = argmin_s sum (delta - s * <b>)^2 over probed denoising steps, "
             "chunks, CFG branches and queries; delta = log Z_S(dequantized keys) - log Z_S(full-precision keys), "
             "both without bias; <b> = sum_i pi_hat_i b_i / sum_i pi_hat_i over cached keys, b the correction at "
             "strength 1, pi_hat the dequantized softmax")
STD_ERROR = "cluster-robust (CR1) standard error of s, one cluster per calibration video; null with < 2 videos"
INTERVAL = "95% interval s +- t(0.975, videos - 1) * std_error (Student's t: few clusters); null without std_error"
SHRINKAGE = ("s' = target + w (s - target), w = d^2 / (d^2 + std_error^2), d = s - target; target where std_error "
             "is null")
# positions of the per-head sums in a probe's moment rows, looked up by key (the probe defines their order)
COUNT, BIAS, SHIFT, BIAS_SQ, BIAS_SHIFT, SHIFT_SQ = (HEAD_MOMENT_KEYS.index(key) for key in (
    "hm_count", "hm_bias", "hm_shift", "hm_bias_sq", "hm_bias_shift", "hm_shift_sq"))


@dataclass
class StrengthFit:
    """Fitted strengths and their statistics, each (L, H)."""

    strengths: np.ndarray
    num_samples: np.ndarray
    std_error: np.ndarray  # NaN where it cannot be estimated
    mean_bias: np.ndarray
    mean_shift: np.ndarray
    residual_rms: np.ndarray


def fit_strengths(moments: np.ndarray) -> StrengthFit:
    """Least-squares strengths from per-video moment sums: moments (L, H, V, 6) in HEAD_MOMENT_KEYS order
    (count, sum <b>, sum delta, sum <b>^2, sum <b> delta, sum delta^2) for V videos."""
    moments = np.asarray(moments, dtype=np.float64)
    if moments.ndim != 4 or moments.shape[-1] != len(HEAD_MOMENT_KEYS):
        raise ValueError(f"moments.shape={moments.shape} is not allowed: it must be (L, H, V, "
                         f"{len(HEAD_MOMENT_KEYS)}) with the sums {HEAD_MOMENT_KEYS}")
    total = moments.sum(axis=2)  # (L, H, 6)
    n, sxx, sxy, syy = total[..., COUNT], total[..., BIAS_SQ], total[..., BIAS_SHIFT], total[..., SHIFT_SQ]
    signal = sxx > 0
    s = np.where(signal, sxy / np.where(signal, sxx, 1.0), 1.0)  # (L, H)
    # cluster-robust variance: the per-video scores u_v = sum_v <b> (delta - s <b>) = Sxy_v - s Sxx_v
    videos = (moments[..., COUNT] > 0).sum(axis=2)  # (L, H)
    u = moments[..., BIAS_SHIFT] - s[..., None] * moments[..., BIAS_SQ]  # (L, H, V)
    with np.errstate(divide="ignore", invalid="ignore"):
        correction = videos / (videos - 1.0)
        var = correction * (u ** 2).sum(axis=2) / sxx ** 2
        std_error = np.where(signal & (videos >= 2), np.sqrt(var), np.nan)
        residual = np.maximum(syy - 2 * s * sxy + s * s * sxx, 0.0)
        safe_n = np.where(n > 0, n, 1.0)
        rms = np.where(n > 0, np.sqrt(residual / safe_n), np.nan)
    return StrengthFit(strengths=s, num_samples=n, std_error=std_error,
                       mean_bias=np.where(n > 0, total[..., BIAS] / safe_n, np.nan),
                       mean_shift=np.where(n > 0, total[..., SHIFT] / safe_n, np.nan), residual_rms=rms)


def t_critical(clusters: np.ndarray | int, level: float = 0.95) -> np.ndarray:
    """Two-sided Student's t critical values for ``clusters`` clusters (df = clusters - 1; NaN below 2)."""
    from scipy import stats

    df = np.asarray(clusters, dtype=np.float64) - 1.0
    with np.errstate(invalid="ignore"):
        return np.where(df >= 1, stats.t.ppf(0.5 + level / 2, np.maximum(df, 1.0)), np.nan)


def strength_interval(fit: StrengthFit, clusters: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) 95% bounds of each strength, (L, H): s +- t(videos - 1) SE; NaN where SE is."""
    half = t_critical(clusters) * fit.std_error
    return fit.strengths - half, fit.strengths + half


def shrink_strengths(strengths: np.ndarray, std_error: np.ndarray, target: float) -> np.ndarray:
    """Strengths shrunk toward ``target`` by their standard errors (module docstring); (L, H) -> (L, H)."""
    d = np.asarray(strengths, dtype=np.float64) - target
    se = np.asarray(std_error, dtype=np.float64)
    known = np.isfinite(se)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(d == 0, 0.0, d * d / (d * d + np.where(known, se, 0.0) ** 2))
    return np.where(known, target + w * d, target)


def accumulate(moments: np.ndarray, probes: Sequence[dict], video: int) -> int:
    """Add one video's probe records (with hm_* keys) into moments[:, :, video]; returns how many records
    were used (denoising steps only: the commit pass at t = 0 is not sampled)."""
    used = 0
    for record in probes:
        if record.get("step") is None or "hm_count" not in record:
            continue
        layer = int(record["layer"])
        sums = np.array([record[k] for k in HEAD_MOMENT_KEYS], dtype=np.float64).T  # (H, 6)
        if layer >= moments.shape[0] or sums.shape[0] != moments.shape[1]:
            raise ValueError(f"a probe of layer {layer} has {sums.shape[0]} heads: the model was expected to have "
                             f"{moments.shape[0]} layers x {moments.shape[1]} heads")
        moments[layer, :, video] += sums
        used += 1
    return used


def git_commit() -> str | None:
    """The source tree's commit (with "-dirty" when it has uncommitted changes); None outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head


def default_name(spec: Any) -> str:
    """<model>-<quantizer>-int<bits>-g<group>-<correction>, e.g. tiny-rtn-int2-g32-taylor."""
    key = spec.key
    return f"{spec.model.name}-{key.label}-int{key.bits}-g{key.group_size}-{spec.attention.correction}"


def calibration_spec(spec: Any) -> Any:
    """The run spec with what a calibration needs: every layer probed (at attention.probe_steps) with the
    per-head moments. Refuses what cannot be calibrated (ValueError naming the key)."""
    from jensenkv.checks import fail

    if spec.is_reference:
        fail("quant", spec.key.label, "a full-precision cache has no quantization error to calibrate for")
    if spec.attention.correction == "none":
        fail("attention.correction", "none", "calibration fits the strength of a correction: use taylor or exact")
    if spec.attention.calibration is not None:
        fail("attention.calibration", spec.attention.calibration,
             "calibrate fits strengths from the correction itself; leave it null here")
    spec = copy.copy(spec)  # not dataclasses.replace: the tree would re-derive probes from eval.metrics
    spec.attention = dataclasses.replace(spec.attention, probes=True, head_moments=True, probe_layers=None)
    return spec


def held_fit(path: Path, content: dict) -> dict | None:
    """The file at ``path`` when it already holds ``content`` up to its provenance (``strengths_file.substance``),
    else None."""
    import json

    from jensenkv.calibration.strengths_file import substance
    from jensenkv.store.files import json_safe, read_json
    from jensenkv.store.record import CorruptRecordError

    try:
        held = read_json(path)
    except (OSError, CorruptRecordError):
        return None
    written = json.loads(json.dumps(json_safe(content)))  # as the file would hold it (lists, not tuples)
    return held if isinstance(held, dict) and substance(held) == substance(written) else None


def calibrate(spec: Any, out: str | Path | None = None, name: str | None = None,
              shrink: float | None = None) -> Path:
    """Generate the calibration videos of ``spec`` (a resolved RunSpec), fit the strengths and write the file
    (``shrink``: a target to shrink them toward by their standard errors; None: as fitted)."""
    import torch
    from tqdm.auto import tqdm

    import jensenkv
    from jensenkv.calibration import CALIBRATION_FORMAT, calibration_identity
    from jensenkv.generation.loop import generate_videos
    from jensenkv.models import build_adapter
    from jensenkv.models.registry import family
    from jensenkv.run.environment import default_threads
    from jensenkv.run.videos import check_finite
    from jensenkv.store.files import atomic_write_json, check_output_file

    spec = calibration_spec(spec)
    if shrink is not None and (isinstance(shrink, bool) or not isinstance(shrink, (int, float))
                               or not math.isfinite(shrink)):
        raise ValueError(f"--shrink={shrink!r} is not allowed: it must be a finite strength to shrink toward "
                         "(1: the correction as derived, 0: none)")
    name = name or default_name(spec) + ("" if shrink is None else f"-shrunk{shrink:g}")
    path = Path(out) if out is not None else spec.results_dir / "calibration" / f"{name}.json"
    setting = "--out" if out is not None else "paths.results_dir"
    check_output_file(path, setting)  # before any video: a bad path must not cost the whole calibration
    if spec.geometry is None:
        raise ValueError(f"model {spec.model.name!r}: its layer and head counts cannot be read from its config files")
    layers, heads = spec.geometry.layers, spec.geometry.heads
    threads = spec.threads or default_threads(spec.model)
    if threads:
        torch.set_num_threads(threads)
    adapter = build_adapter(spec.model, cache=spec.cache_config(keep_reference=True), attention=spec.attention,
                            generation=spec.generation)
    jobs = [(p, s) for p in spec.prompts for s in spec.eval.seeds]
    moments = np.zeros((layers, heads, len(jobs), len(HEAD_MOMENT_KEYS)))  # (L, H, V, 6)
    records = 0
    size = family(spec.model.kind).batch_size(spec, len(jobs))
    with tqdm(total=len(jobs), desc=f"calibrate {name}", unit="video", leave=False) as bar:
        for first in range(0, len(jobs), size):
            batch = jobs[first:first + size]
            results = generate_videos(adapter, [p for p, _ in batch], [s for _, s in batch])
            for video, ((prompt, seed), result) in enumerate(zip(batch, results), start=first):
                check_finite(result.video, f"calibration prompt {prompt!r} seed {seed}")
                records += accumulate(moments, result.probes or [], video)
            bar.update(len(batch))
    if records == 0:
        raise ValueError("the calibration videos recorded no probe with cached quantized keys (one chunk, or "
                         "attention.probe_steps outside the schedule): nothing to fit; use generation.num_chunks >= 2")
    fit = fit_strengths(moments)
    clusters = (moments[..., COUNT] > 0).sum(axis=2)  # (L, H) videos behind each entry
    low, high = strength_interval(fit, clusters)
    strengths = fit.strengths if shrink is None else shrink_strengths(fit.strengths, fit.std_error, float(shrink))

    def table(values: np.ndarray) -> list[list[float | None]]:
        return [[float(v) if math.isfinite(v) else None for v in row] for row in values]

    content = {
        "format": CALIBRATION_FORMAT,
        "name": name,
        "strengths": table(strengths),
        "num_samples": [[int(v) for v in row] for row in fit.num_samples],
        "std_error": table(fit.std_error),
        "interval": {"low": table(low), "high": table(high), "t_critical": table(t_critical(clusters)),
                     "clusters": [[int(v) for v in row] for row in clusters], "method": INTERVAL},
        "fit": {"strengths": table(fit.strengths), "mean_bias": table(fit.mean_bias),
                "mean_shift": table(fit.mean_shift), "residual_rms": table(fit.residual_rms),
                "probe_records": records},
        "shrinkage": None if shrink is None else {"target": float(shrink), "method": SHRINKAGE},
        "objective": OBJECTIVE,
        "std_error_method": STD_ERROR,
        "identity": calibration_identity(spec),
        "calibration": {"prompts": list(spec.prompts), "seeds": list(spec.eval.seeds),
                        "probe_steps": spec.attention.probe_steps, "videos": len(jobs),
                        "generation": spec.generation.sampling(),
                        "strength_during_generation": spec.attention.strength,
                        "backend": spec.attention.backend,
                        "values": dataclasses.asdict(spec.value),
                        "sink_chunks": spec.cache.sink_chunks, "window_chunks": spec.cache.window_chunks},
        "model": {"name": spec.model.name, "kind": spec.model.kind, "layers": layers, "heads": heads},
        "quantizer": spec.key.label,
        "correction": spec.attention.correction,
        "jensenkv_version": jensenkv.__version__,
        "git_commit": git_commit(),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    held = held_fit(path, content)
    if held is not None:  # a rerun of the same fit: the file (and its provenance) stays as it is
        log.info("%s already holds this fit (made %s): left as it is", path, held.get("created_at"))
        return path
    try:
        atomic_write_json(path, content)
    except OSError as e:  # e.g. the disk filled up while the videos were generated
        raise ValueError(f"{setting}: cannot write {path} ({e.strerror or e}); the fit is lost, free space or "
                         "choose another path and rerun") from None
    log.info("wrote %s", path)
    return path


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m jensenkv.calibration", description=__doc__.split("\n\n")[0],
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", help="file name (default: <model>-<quantizer>-int<bits>-g<group>-<correction>)")
    parser.add_argument("--out", help="output path (default: <paths.results_dir>/calibration/<name>.json)")
    parser.add_argument("--shrink", type=float, default=None, metavar="TARGET",
                        help="shrink the strengths toward TARGET by their standard errors (1: the derived "
                             "correction, 0: none); default: as fitted")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m jensenkv.run")
    args = parser.parse_args(list(argv))
    return args, list(args.overrides)


def calibrate_overrides(overrides: Sequence[str] = (), out: str | Path | None = None,
                        name: str | None = None, shrink: float | None = None) -> Path:
    """Compose ``overrides`` as ``python -m jensenkv.calibration`` does (eval=calibration by default) and calibrate."""
    from jensenkv.run import compose_config
    from jensenkv.config.resolve import build_spec

    overrides = list(overrides)
    if not any(o.split("=", 1)[0].lstrip("+~") == "eval" for o in overrides):
        overrides.insert(0, "eval=calibration")  # calibration prompts unless told otherwise
    return calibrate(build_spec(compose_config(overrides)), out=out, name=name, shrink=shrink)


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry: one line and exit 2 for bad input, like ``python -m jensenkv.run``."""
    from jensenkv.run.cli import run_command

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    run_command(overrides, lambda: calibrate_overrides(overrides, out=args.out, name=args.name, shrink=args.shrink))

