"""The suite's report files: bench.csv (this run's rows merged with the earlier rows of the benchmarks it did not
run, each row with its commit and date) and bench.md (the targets met or missed, then one table per benchmark).
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pandas as pd
import torch

from jensenkv.store.files import atomic_write
from jensenkv.bench.plan import BENCHMARKS, Plan

COLUMNS = ("benchmark", "config", "value", "unit", "iqr", "repeats", "commit", "measured")
UNKNOWN = "unknown"  # commit / date of a row measured before rows carried them


# (benchmark, config prefix, comparison, bound or target row, description)
TARGETS = (
    ("held_memory_ratio", "RSS growth / stored", "<=", "target", "RSS growth of the cache / stored bytes"),
    ("held_memory_ratio", "live tensor bytes / stored", "<=", "target", "live tensor bytes / stored bytes"),
    ("generation_peak_memory_saving", "(peak BF16", ">=", 0.60, "INT2 peak below BF16 peak, share of BF16 cache"),
    ("correction_overhead_ratio", "taylor / none, median", "<=", 1.035, "Taylor overhead, median over shapes"),
    ("correction_overhead_ratio", "taylor / none, worst", "<=", 1.05, "Taylor overhead, worst shape"),
    ("correction_overhead_ratio", "exact / none, median", "<=", 1.10, "exact overhead, median over shapes"),
    ("e2e_time_ratio", "INT2 g=32 + taylor / BF16, built-in", "<=", 1.10, "end to end, built-in model"),
    ("e2e_time_ratio", "INT2 g=32 + taylor / BF16, long-context", "<=", 1.05, "end to end, long-context"),
    ("batch_throughput", "over batch 1", ">=", 3.0, "videos/s per core, a batch over batch 1"),
    ("batch_throughput", "over batch 1, a forward per branch", ">=", 3.0,
     "videos/s per core, a batch over the unbatched generator (a forward per CFG branch)"),
    ("probe_overhead", "built-in model, probes on every layer and step /", "<=", 1.5,
     "dP_S probes on every layer and step, built-in model"),
    ("run_imports", "a built-in run's imports above torch's", "<=", 3.0,
     "a built-in run's imports, CPU seconds above torch's own"),
)


def target_lines(frame: pd.DataFrame) -> list[str]:
    """One line per target: the measured value, the bound and met / missed."""
    lines = []
    for benchmark, prefix, op, bound, text in TARGETS:
        rows = frame[(frame.benchmark == benchmark) & frame.config.str.contains(prefix, regex=False)
                     & (frame.unit != "ratio (wall)")]
        if rows.empty:
            lines.append(f"| {text} | not measured | {op} {bound} | |")
            continue
        value = rows.value.iloc[0]
        if bound == "target":
            bound = frame[(frame.benchmark == benchmark) & frame.config.str.endswith(": target")].value.iloc[0]
        met = value <= bound if op == "<=" else value >= bound
        lines.append(f"| {text} | {value:.3f} | {op} {bound:.3f} | {'met' if met else 'missed'} |")
    return lines


def code_commit() -> str:
    """The commit being measured: HEAD's short id, "+dirty" when tracked files outside results/ differ from it;
    "unknown" outside a git checkout."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(top,exclude)results")
    except (OSError, subprocess.CalledProcessError):
        return UNKNOWN
    return head + ("+dirty" if dirty else "")


def merge_rows(frame: pd.DataFrame, path: Path, replaced: tuple[str, ...]) -> pd.DataFrame:
    """This run's rows and every row of the bench.csv at ``path`` whose benchmark is not in ``replaced`` (the ones
    just run), in BENCHMARKS order: a run of one benchmark must not drop the others' measurements."""
    if not path.is_file():
        return frame
    kept = pd.read_csv(path, dtype={"commit": str, "measured": str})
    kept = kept[~kept.benchmark.isin(replaced)].reindex(columns=list(COLUMNS))
    kept[["commit", "measured"]] = kept[["commit", "measured"]].fillna(UNKNOWN)
    merged = pd.concat([kept, frame], ignore_index=True) if not kept.empty else frame
    order = {name: i for i, name in enumerate(BENCHMARKS)}
    return merged.sort_values("benchmark", key=lambda b: b.map(order).fillna(len(order)), kind="stable",
                              ignore_index=True)


def kept_notes(path: Path, replaced: tuple[str, ...]) -> list[str]:
    """The notes of an existing bench.md that belong to benchmarks not run again (a note starts with its
    benchmark's name and a colon)."""
    text = path.read_text() if path.exists() else ""
    if "\n## Notes\n" not in text:
        return []
    notes = [line[2:] for line in text.split("\n## Notes\n", 1)[1].splitlines() if line.startswith("- ")]
    return [n for n in notes if n.split(":", 1)[0] not in replaced]


def write_report(frame: pd.DataFrame, out_dir: Path, plan: Plan, seconds: float, kept: list[str] = ()) -> None:
    """bench.csv (every row, full precision) and bench.md (targets, then one table per benchmark; the notes of this
    run after ``kept``, the earlier notes of benchmarks it did not run)."""
    atomic_write(out_dir / "bench.csv", lambda f: f.write(frame.to_csv(index=False)), mode="w")
    cpu = platform.processor() or platform.machine()
    lines = ["# jensenkv benchmarks", "",
             f"CPU {cpu}, {len(os.sched_getaffinity(0))} usable cores, torch {torch.__version__} with "
             f"{torch.get_num_threads()} threads (OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}), GPU: "
             f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}; wall time of the last run {seconds:.0f} s (each row names the commit and the date it measured).",
             "Timing ratios: median of paired, interleaved repetitions, with their interquartile range (iqr); "
             "unit `ratio` is process CPU time (what the targets read), `ratio (wall)` wall clock.",
             "Memory: measured in fresh processes with MALLOC_MMAP_THRESHOLD_=131072 (RSS), and as live tensor "
             "bytes (cache tensors plus the shared attention workspace).", ""]
    if plan.quick:
        lines += ["Smoke run (`--quick`): tiny sizes, the numbers mean nothing"
                  + ("" if plan.fresh_processes else "; memory measured in this process, not fresh ones") + ".", ""]
    lines += ["## Targets", "", "| target | measured | bound | |", "|---|---|---|---|", *target_lines(frame)]
    for benchmark, group in frame.groupby("benchmark", sort=False):
        shown = group.drop(columns="benchmark").copy()
        lines += ["", f"## {benchmark}", "", shown.to_markdown(index=False, floatfmt=".4g")]
    notes = [*kept, *plan.notes]
    if notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in notes]]
    atomic_write(out_dir / "bench.md", lambda f: f.write("\n".join(lines) + "\n"), mode="w")
