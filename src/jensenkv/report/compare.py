"""Did a rerun reproduce the committed results? Every number against its tolerance, every verdict equal.

    python -m jensenkv.report.compare [<rerun>] [<committed>] [--out DIR]

``<rerun>``: a results dir or store holding a rerun's reports (default: ``--results``, i.e. ``$JENSENKV_RESULTS``,
else ``results``); ``<committed>``: the results to hold it against (default: the checkout's committed
``results/``, read from git's HEAD, so ``make reproduce-table1``, which rewrites ``results/`` in place, still
compares against what was committed). Prints one line per file: identical, within tolerance, or beyond it (naming
the cells), then both sides' platforms (``platform.json``) when a file differs. Exits 0 when nothing is beyond
tolerance, 4 when something is (the exit-code table, ``jensenkv.exit_codes``).

Compared: ``table1.csv`` (each cell against its tolerance, ``report.tolerance``), ``table1_layers.csv`` and the
LLM tables (each cell), ``table1_videos.csv`` and ``noise_floor.csv`` (per-video rows: each column's mean
|change|), ``claims.md`` (every verdict, equal; ``report.claim_verdicts``). Not compared: ``table1.md`` / ``.tex``
(rendered from table1.csv), the figures (drawn from the tables), ``bench.*`` (timings of one machine), the
calibration file (its strengths are judged through the calibrated row of table1.csv). Run ids are not compared:
the calibrated row's id includes the calibration file's digest, which moves with its float values.
"""
from __future__ import annotations

import argparse
import math
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from jensenkv.exit_codes import BAD_INPUT, DIFFERS, EPILOG, guarded, stop
from jensenkv.machine import PLATFORM_FILE, read_platform, summary
from jensenkv.report.claim_verdicts import changed
from jensenkv.report.publish import PROJECT, default_results, shown_path
from jensenkv.report.tolerance import K, Scale, cell_tolerances, scale

TABLE1, VIDEOS, NOISE, CLAIMS = "table1.csv", "table1_videos.csv", "noise_floor.csv", "claims.md"
TABLES = ("table1_layers.csv", "llm_prefill.csv", "llm_prefill_layers.csv", "llm_prefill_windows.csv",
          "llm_attention_stats.csv")
FILES = (TABLE1, "table1_layers.csv", VIDEOS, NOISE, CLAIMS, *TABLES[1:], PLATFORM_FILE)
SKIPPED = {"run_id", "psnr_vs_unperturbed", "identical"}  # ids (see above); the floor's own chaotic inputs
DIGEST = re.compile(r"\b(calibration) [0-9a-f]{8,}\b")  # a calibrated treatment names its file's digest
NAMED = 5  # cells named per file beyond tolerance


@dataclass
class Outcome:
    """One file's comparison: ``moved`` cells within tolerance, ``beyond`` lines naming the others."""

    name: str
    identical: bool = False
    moved: int = 0
    cells: int = 0
    worst: str = ""
    beyond: list[str] = field(default_factory=list)
    note: str = ""
    only_rerun: bool = False

    def line(self) -> str:
        if self.only_rerun:
            return f"{self.name}: only in the rerun (nothing committed to compare)"
        if self.identical:
            return f"{self.name}: identical"
        if self.beyond:
            more = f"; and {len(self.beyond) - NAMED} more" if len(self.beyond) > NAMED else ""
            return f"{self.name}: BEYOND tolerance: " + "; ".join(self.beyond[:NAMED]) + more
        worst = f", largest {self.worst}" if self.worst else ""
        return f"{self.name}: within tolerance ({self.moved} of {self.cells} values differ{worst}){self.note}"


def committed_results(checkout: Path, into: Path, ref: str = "HEAD") -> Path:
    """The compared files of ``<ref>:results/`` in ``checkout``'s git, written under ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    try:
        listed = subprocess.run(["git", "-C", str(checkout), "ls-tree", "--name-only", f"{ref}:results"],
                                capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError) as e:
        raise FileNotFoundError(f"{checkout} is not a git checkout with committed results/ ({e}): name the "
                                "committed results dir as the second argument") from None
    for name in FILES:
        if name in listed:
            blob = subprocess.run(["git", "-C", str(checkout), "show", f"{ref}:results/{name}"],
                                  capture_output=True, check=True).stdout
            (into / name).write_bytes(blob)
    return into


def _read(path: Path) -> pd.DataFrame | None:
    return pd.read_csv(path) if path.is_file() else None


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows indexed by their text and integer columns (calibration digests masked), plus an occurrence count."""
    frame = frame.copy()
    keys = [c for c in frame.columns if c not in SKIPPED and not pd.api.types.is_float_dtype(frame[c])]
    for c in keys:
        frame[c] = frame[c].astype(str).str.replace(DIGEST, r"\1", regex=True)
    frame["#"] = frame.groupby(keys, dropna=False).cumcount() if keys else range(len(frame))
    return frame.set_index([*keys, "#"])


def _name(key: tuple, column: str) -> str:
    parts = [str(k) for k in (key if isinstance(key, tuple) else (key,))[:-1] if str(k) not in ("nan", "")]
    return f"[{', '.join(parts[:6])}] {column}"


def compare_frames(name: str, old: pd.DataFrame, new: pd.DataFrame,
                   tolerance: Callable[[str], pd.Series | float], population: bool = False) -> Outcome:
    """Cell by cell (``population``: each column's mean |change| over rows) against ``tolerance(column)``
    (a per-row series on ``old``'s index, or one number; NaN: not judged, e.g. p-values)."""
    out = Outcome(name)
    a, b = _keyed(old), _keyed(new)
    if set(a.columns) != set(b.columns):
        out.beyond.append(f"columns differ: only committed {sorted(set(a.columns) - set(b.columns))}, only rerun "
                          f"{sorted(set(b.columns) - set(a.columns))}")
    for only, side in ((a.index.difference(b.index), "committed"), (b.index.difference(a.index), "rerun")):
        out.beyond += [f"row only in the {side} file: {_name(k, '')}" for k in only]
    rows = a.index.intersection(b.index)
    a, b = a.loc[rows], b.loc[rows]
    worst = (0.0, "")
    for column in [c for c in a.columns if c in b.columns and c not in SKIPPED]:
        x, y = a[column], b[column]
        if not pd.api.types.is_float_dtype(x) or not pd.api.types.is_float_dtype(y):
            continue  # text and integers are the index: equal by construction
        x, y = x.to_numpy(float), y.to_numpy(float)
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        out.cells += len(x)
        out.moved += int((~same).sum())
        if same.all():
            continue
        tol = tolerance(column)
        tol = np.broadcast_to(np.asarray(tol.reindex(rows) if isinstance(tol, pd.Series) else tol, float), x.shape)
        diff = np.where(same, 0.0, np.abs(x - y))
        diff = np.where(np.isnan(diff) & ~same, np.inf, diff)  # a value that appeared or vanished
        if population:
            judged = ~np.isnan(tol)
            mean = float(diff[judged].mean()) if judged.any() else 0.0
            limit = float(np.nanmax(tol)) if judged.any() else math.nan
            if math.isfinite(limit) and mean > limit:
                top = np.argsort(-diff)[:3]
                out.beyond.append(f"{column}: mean |change| {mean:.3g} over {len(x)} rows > {limit:.3g} (largest: "
                                  + ", ".join(f"{_name(rows[i], '')} {x[i]:.4g} -> {y[i]:.4g}" for i in top) + ")")
            elif math.isfinite(limit) and limit > 0 and mean / limit > worst[0]:
                worst = (mean / limit, f"{column} mean |change| {mean:.3g} = {mean / limit:.2f} x its tolerance")
            continue
        for i in np.flatnonzero(~same):
            if np.isnan(tol[i]):
                continue  # judged elsewhere (p-values: by their verdicts)
            if diff[i] > tol[i]:
                out.beyond.append(f"{_name(rows[i], column)}: {x[i]:.6g} -> {y[i]:.6g} (tolerance {tol[i]:.3g})")
            elif tol[i] > 0 and diff[i] / tol[i] > worst[0]:
                worst = (diff[i] / tol[i], f"{_name(rows[i], column)} {x[i]:.4g} -> {y[i]:.4g} = "
                                           f"{diff[i] / tol[i]:.2f} x its tolerance")
    out.worst = worst[1]
    return out


def _spread_tolerance(frame: pd.DataFrame, sc: Scale) -> Callable[[str], float]:
    """K x phi x the column's SD over the file's rows (0 without a floor: equal)."""
    return lambda column: K * sc.phi * np.nan_to_num(pd.to_numeric(frame[column], errors="coerce")
                                                     .replace([np.inf, -np.inf], np.nan).std())


def compare_dirs(committed: Path, rerun: Path) -> tuple[list[Outcome], Scale]:
    """Every compared file present in ``committed`` or ``rerun``."""
    sc = scale([_read(committed / NOISE), _read(rerun / NOISE)], _read(committed / VIDEOS))
    outcomes = []
    for name in FILES:
        old, new = committed / name, rerun / name
        if name == PLATFORM_FILE or not (old.is_file() or new.is_file()):
            continue
        if not new.is_file():
            outcomes.append(Outcome(name, beyond=["missing in the rerun"]))
        elif not old.is_file():
            outcomes.append(Outcome(name, only_rerun=True))
        elif old.read_bytes() == new.read_bytes():
            outcomes.append(Outcome(name, identical=True))
        elif name == CLAIMS:
            lines = changed(old.read_text(), new.read_text())
            outcomes.append(Outcome(name, beyond=[f"verdict {line}" for line in lines],
                                    note="; every verdict equal (its numbers are judged in the tables)"))
        else:
            outcomes.append(_compare_table(name, pd.read_csv(old), pd.read_csv(new), sc))
    return outcomes, sc


def _compare_table(name: str, old: pd.DataFrame, new: pd.DataFrame, sc: Scale) -> Outcome:
    if name == TABLE1:
        keyed = _keyed(old)
        spreads = {c: float(pd.to_numeric(old[c], errors="coerce").std()) for c in old.columns
                   if pd.api.types.is_float_dtype(old[c])}
        cells = cell_tolerances(keyed, sc, spreads)
        generic = _spread_tolerance(old, sc)

        def tolerance(column: str) -> pd.Series | float:
            if column.startswith("p_"):
                return math.nan  # judged by the verdicts it decides (claims.md)
            return cells[column] if cells[column].notna().any() else generic(column)
        out = compare_frames(name, old, new, tolerance)
        out.note = "; p-values judged by claims.md's verdicts" if out.moved else ""
        return out
    spread = _spread_tolerance(old, sc)
    if name == VIDEOS:  # per-video rows: Table 1's metrics by their per-video spread
        return compare_frames(name, old, new, lambda c: K * sc.phi * sc.video_sd.get(c, 0.0), population=True)
    return compare_frames(name, old, new, spread, population=name == NOISE)


def report(committed: Path, rerun: Path, committed_label: str) -> tuple[str, bool]:
    """(the report's text, whether everything is within tolerance)."""
    outcomes, sc = compare_dirs(committed, rerun)
    lines = [f"{shown_path(rerun)} against {committed_label}:", f"tolerance: {sc.describe()}"]
    lines += [o.line() for o in outcomes]
    if not outcomes:
        lines.append("no compared file on either side (table1.csv, claims.md, ...)")
    if any(not o.identical for o in outcomes):
        lines += [f"platform, committed: {summary(read_platform(committed))}",
                  f"platform, rerun:     {summary(read_platform(rerun))}"]
    ok = bool(outcomes) and not any(o.beyond for o in outcomes)
    lines.append("reproduced: " + ("every number within tolerance, every verdict equal" if ok else
                                    "NO: the files above marked BEYOND moved more than float noise explains"))
    return "\n".join(lines) + "\n", ok


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jensenkv.report.compare", description=__doc__.split("\n\n")[0],
                                     epilog=EPILOG)
    parser.add_argument("rerun", nargs="?", help="results dir or store with the rerun's reports (default: --results)")
    parser.add_argument("committed", nargs="?",
                        help="results dir to compare against (default: the checkout's committed results/, git HEAD)")
    parser.add_argument("--results", default=default_results(),
                        help="the rerun's results dir when <rerun> is not given (default: $JENSENKV_RESULTS, else "
                             "results)")
    parser.add_argument("--out", default=None, help="also write the report to <out>/compare.txt (default: print only)")
    args = parser.parse_args(argv)
    guarded(lambda: _main(args))


def _main(args: argparse.Namespace) -> None:
    rerun = Path(args.rerun or args.results)
    if not rerun.is_dir():
        stop(f"error: no results dir {rerun}", BAD_INPUT)
    with tempfile.TemporaryDirectory(prefix="jensenkv-committed-") as tmp:
        if args.committed:
            committed, label = Path(args.committed), shown_path(args.committed)
            if not committed.is_dir():
                stop(f"error: no results dir {committed}", BAD_INPUT)
        else:
            try:
                committed = committed_results(PROJECT, Path(tmp))
            except FileNotFoundError as e:
                stop(f"error: {e}", BAD_INPUT)
            label = "the committed results/ (git HEAD)"
        text, ok = report(committed, rerun, label)
    print(text, end="")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "compare.txt").write_text(text)
    if not ok:
        stop("beyond tolerance: the rerun did not reproduce the committed results (lines above)", DIFFERS)


if __name__ == "__main__":
    main()
