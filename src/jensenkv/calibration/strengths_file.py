"""Calibration files: signed per-(layer, head) correction strengths fitted by ``python -m jensenkv.calibration``.

A run names one with ``attention.calibration=<path>``; its effective strength for layer l, head h is
``attention.strength * strengths[l][h]``. The file is JSON (written atomically), with its provenance:

    format        CALIBRATION_FORMAT
    strengths     [layers][heads] finite floats (signed)
    num_samples   [layers][heads] (probed query rows behind each entry)
    std_error     [layers][heads] standard error of each entry (null where it cannot be estimated)
    objective     how the strengths were fitted
    identity      model / weights / key quantizer / correction the strengths belong to (``calibration_identity``)
    calibration   prompts, seeds, probe steps and the sampler they were fitted on
    interval      95% bounds per entry with Student's t critical values (few clusters: one per video)
    fit           the fitted strengths and statistics (``strengths`` differ from them when shrinkage is set)
    shrinkage     null, or the target the strengths were shrunk toward by their standard errors
    model, quantizer, correction, jensenkv_version, git_commit, created_at

A run refuses a file (``check_calibration``, before any model is loaded) that is missing or corrupt, whose
layer/head counts differ from the model's, whose prompts or seeds overlap the run's evaluation prompts or seeds
(no tuning on what is evaluated: a seed shared with the evaluation shares its noise), or whose identity differs
from the run's. The run's id includes the file's content digest.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CALIBRATION_FORMAT = "jensenkv-calibration/1"
KEY = "attention.calibration"
LOCATION_FIELDS = ("device", "weights_dir", "cache_dir")  # model fields that say where, not what
REQUIRED = ("format", "strengths", "num_samples", "std_error", "objective", "identity", "calibration")
PROVENANCE_ONLY = ("created_at", "git_commit")  # when and from which commit: not part of the digest


@dataclass(frozen=True)
class Calibration:
    """A loaded calibration file."""

    path: str
    digest: str                       # sha256 of the file's bytes (16 hex digits): part of a run's identity
    strengths: tuple[tuple[float, ...], ...]  # [layers][heads]
    identity: dict
    prompts: tuple[str, ...]
    content: dict                     # the whole file

    @property
    def layers(self) -> int:
        return len(self.strengths)

    @property
    def heads(self) -> int:
        return len(self.strengths[0])


def fail_calibration(path: str, why: str) -> None:
    raise ValueError(f"{KEY}={path!r} is not allowed: {why}")


def load_calibration(path: str) -> Calibration:
    """Read and check a calibration file; ValueError naming attention.calibration, the path and what is wrong."""
    file = Path(str(path)).expanduser()
    if not file.is_file():
        fail_calibration(path, "the file does not exist (write one with `python -m jensenkv.calibration`)")
    stat = file.stat()
    return _load(str(file.resolve()), stat.st_size, stat.st_mtime_ns, str(path))


def substance(content: dict) -> str:
    """What a calibration file says, as canonical JSON, without when or from which commit it was written: a rerun
    of the same fit (same strengths, prompts and identity) has the same substance, so it names the same runs (the
    digest) and leaves its file as it is (``calibration.fit``)."""
    return json.dumps({k: v for k, v in content.items() if k not in PROVENANCE_ONLY}, sort_keys=True)


@functools.lru_cache(maxsize=16)
def _load(resolved: str, size: int, mtime_ns: int, given: str) -> Calibration:
    raw = Path(resolved).read_bytes()
    try:
        content = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        fail_calibration(given, f"the file is corrupt ({type(e).__name__}: {e})")
    if not isinstance(content, dict) or content.get("format") != CALIBRATION_FORMAT:
        fail_calibration(given, f"the file is not a calibration file (its format must be {CALIBRATION_FORMAT!r})")
    absent = [k for k in REQUIRED if k not in content]
    if absent:
        fail_calibration(given, f"the file is corrupt: it lacks {absent}")
    strengths = content["strengths"]
    if not isinstance(strengths, list) or not strengths or not all(isinstance(row, list) and row for row in strengths):
        fail_calibration(given, "the file is corrupt: strengths must be a non-empty [layers][heads] list of lists")
    heads = len(strengths[0])
    for layer, row in enumerate(strengths):
        if len(row) != heads:
            fail_calibration(given, f"the file is corrupt: layer {layer} has {len(row)} strengths, layer 0 has {heads}")
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in row):
            fail_calibration(given, f"the file is corrupt: layer {layer}'s strengths {row} must all be finite numbers")
    prompts = (content["calibration"] or {}).get("prompts") if isinstance(content["calibration"], dict) else None
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        fail_calibration(given, "the file is corrupt: calibration.prompts must be a list of strings")
    if not isinstance(content["identity"], dict):
        fail_calibration(given, "the file is corrupt: identity must be a mapping")
    digest = hashlib.sha256(substance(content).encode()).hexdigest()[:16]
    return Calibration(path=given, digest=digest,
                       strengths=tuple(tuple(float(s) for s in row) for row in strengths),
                       identity=content["identity"], prompts=tuple(prompts), content=content)


def prompt_key(prompt: str) -> str:
    """Prompts compared for overlap: case and spacing do not make a prompt new."""
    return " ".join(prompt.lower().split())


def calibration_identity(run: Any) -> dict:
    """What calibrated strengths belong to (``run``: a resolved jensenkv.config.resolve.RunSpec): the model (its
    config without where it runs or where its files sit on this machine, plus its weights' digest), the key
    quantizer (whose error the correction targets) and the correction. Values, cache layout and sampler are
    recorded in the file but not required to match."""
    model = {k: v for k, v in run.model.to_dict().items() if k not in LOCATION_FIELDS}
    return {"model": model, "weights": run.weights_digest, "key": dataclasses.asdict(run.key),
            "correction": run.attention.correction}


def _differences(expected: dict, found: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two identity mappings."""
    out = []
    for key in sorted(set(expected) | set(found)):
        a, b = expected.get(key), found.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} (file: {b!r}, run: {a!r})")
    return out


def check_calibration(run: Any, shape: tuple[int, int] | None) -> Calibration:
    """Load the run's calibration file and refuse it (ValueError naming attention.calibration, the path and
    why) when it does not fit the run (a resolved RunSpec): the model's (layers, heads) ``shape`` (None:
    unknown), prompt or seed overlap with the evaluation prompts and seeds, identity."""
    path = run.attention.calibration
    cal = load_calibration(path)
    if shape is not None and shape != (cal.layers, cal.heads):
        fail_calibration(path, f"it holds strengths for {cal.layers} layers x {cal.heads} heads, model "
                               f"{run.model.name!r} has {shape[0]} layers x {shape[1]} heads")
    overlap = sorted({prompt_key(p) for p in cal.prompts} & {prompt_key(p) for p in run.prompts})
    if overlap:
        fail_calibration(path, f"its calibration prompts overlap the run's evaluation prompts {overlap}: strengths "
                               "must be fitted on prompts disjoint from the ones they are judged on (calibrate on "
                               "eval=calibration)")
    seeds = cal.content["calibration"].get("seeds")
    if not isinstance(seeds, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds):
        fail_calibration(path, "it does not list the integer seeds it was fitted on (calibration.seeds): refit it "
                               "with `python -m jensenkv.calibration`")
    shared = sorted(set(seeds) & {int(x) for x in run.eval.seeds})
    if shared:
        fail_calibration(path, f"its calibration seeds overlap the run's evaluation seeds {shared}: strengths must "
                               "be fitted on seeds disjoint from the ones they are judged on (eval=calibration uses "
                               "seed 1000)")
    differ = _differences(calibration_identity(run), cal.identity)
    if differ:
        fail_calibration(path, "it was fitted for another model, quantizer or correction: " + "; ".join(differ[:4])
                         + (f"; and {len(differ) - 4} more" if len(differ) > 4 else ""))
    return cal


def strength_label(strength: float, calibration: str | None) -> float | str:
    """A run's strength column: the float, or "calibrated" ("<s>x calibrated" for a global multiplier s != 1)."""
    if calibration is None:
        return strength
    return "calibrated" if strength == 1.0 else f"{strength:g}x calibrated"


def digest(path: str | None) -> str | None:
    """The content digest of a calibration file (None without one)."""
    return None if path is None else load_calibration(path).digest

