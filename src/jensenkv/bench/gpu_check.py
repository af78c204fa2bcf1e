"""`make gpu-check`: the GPU checks in at most 8 minutes -> results/gpu_check.csv and results/gpu_check.md.

    python scripts/gpu_check.py                      # on a CUDA machine: real shapes, bfloat16
    python scripts/gpu_check.py --dry-run --out-dir /tmp/g   # here: CPU, TRITON_INTERPRET=1, float32, toy sizes

Each group of checks (jensenkv.bench.gpu_checks.GROUPS) runs in a process of its own, so a crash or a hung
kernel in one (a CUDA fault poisons its whole process) costs only that group: its rows so far are kept, and
one "failed" row says how it ended. The whole run keeps to ``--budget`` seconds: a group gets what is left
of it, and a case that would start after the deadline is a "skipped" row.

A row: check, case, status (passed / failed / met / missed / measured / skipped), value, unit, target, detail
(the error of a failed case), seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from jensenkv.store.files import atomic_write

COLUMNS = ("check", "case", "status", "value", "unit", "target", "detail", "seconds")
STATUSES = ("passed", "failed", "met", "missed", "measured", "skipped")
GROUP_ORDER = ("environment", "pytest", "oracle", "kernel", "generation")
# each group's share of the budget: a group may use its share plus what the groups before it left unused, so
# a slow compile in one cannot starve the ones after it
SHARES = {"environment": 0.05, "pytest": 0.2, "oracle": 0.25, "kernel": 0.25, "generation": 0.25}
DEFAULT_BUDGET_S = 450.0  # of the 8 minutes: the rest for start-up, the report and the margin
ROOT = Path(__file__).resolve().parents[3]


def _row(check: str, case: str, status: str, detail: str = "", seconds: float = float("nan")) -> dict:
    return {"check": check, "case": case, "status": status, "value": float("nan"), "unit": "", "target": "",
            "detail": detail, "seconds": seconds}


def run_group(name: str, rows_path: Path, dry_run: bool, timeout: float) -> list[dict]:
    """One group in a fresh process; its rows, plus a "failed" row if the process did not end cleanly."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if dry_run:
        env["TRITON_INTERPRET"] = "1"
    deadline = time.time() + timeout
    command = [sys.executable, "-m", "jensenkv.bench.gpu_check", "--group", name, "--rows", str(rows_path),
               "--deadline", repr(deadline - 5.0)] + (["--dry-run"] if dry_run else [])
    started = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        ended = None if done.returncode == 0 else \
            f"exit code {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:300]}"
    except subprocess.TimeoutExpired:
        ended = f"killed after {timeout:.0f} s (its share of the time budget)"
    rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()] \
        if rows_path.is_file() else []
    if ended is not None:
        rows.append(_row(name, f"{name} (process)", "failed", ended, time.perf_counter() - started))
    return rows


def run_all(groups: tuple[str, ...], work_dir: Path, dry_run: bool, budget: float,
            log=lambda msg: print(msg, flush=True)) -> pd.DataFrame:
    """Every group in turn within ``budget`` seconds, each until its share's end (``SHARES``, over the groups
    run; time a group leaves unused passes to the next); a group with under 5 s left is skipped."""
    start = time.time()
    deadline = start + budget
    total = sum(SHARES.get(name, 1.0 / len(GROUP_ORDER)) for name in groups)
    share_end = start
    rows: list[dict] = []
    for name in groups:
        share_end += budget * SHARES.get(name, 1.0 / len(GROUP_ORDER)) / total
        left = min(share_end, deadline) - time.time()
        if left < 5.0:
            rows.append(_row(name, f"{name} (process)", "skipped", "time budget spent before this group"))
            continue
        log(f"[gpu-check {time.strftime('%H:%M:%S')}] {name} ({left:.0f} s of {deadline - time.time():.0f} s left)")
        got = run_group(name, work_dir / f"{name}.jsonl", dry_run, left)
        rows += got
        failed = sum(r["status"] in ("failed", "missed") for r in got)
        log(f"[gpu-check {time.strftime('%H:%M:%S')}] {name}: {len(got)} rows, {failed} failed or missed")
    return pd.DataFrame(rows, columns=list(COLUMNS))


def write_report(frame: pd.DataFrame, out_dir: Path, dry_run: bool, seconds: float, budget: float) -> None:
    """gpu_check.csv (every row) and gpu_check.md (a summary, then one table per check)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / "gpu_check.csv", lambda f: f.write(frame.to_csv(index=False)), mode="w")
    env = frame[frame.check == "environment"].set_index("case").detail.to_dict()
    counts = frame.status.value_counts().to_dict()
    lines = ["# jensenkv GPU check", "",
             f"Device: {env.get('device', 'unknown')}; torch {env.get('torch', '?')}, triton {env.get('triton', '?')}, "
             f"diffusers {env.get('diffusers', '?')}, python {env.get('python', '?')}. Wall time {seconds:.0f} s of a "
             f"{budget:.0f} s budget ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}).",
             "Rows: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES) + ".", ""]
    if dry_run:
        lines += ["**Dry run** (`--dry-run`): CPU, TRITON_INTERPRET=1, float32 operands, toy shapes. It checks the "
                  "plumbing; its times and sizes mean nothing.", ""]
    targets = frame[frame.status.isin(["met", "missed"])]
    if not targets.empty:
        lines += ["## Targets", "", targets[["case", "value", "target", "status"]].to_markdown(
            index=False, floatfmt=".3f"), ""]
    failed = frame[frame.status == "failed"]
    if not failed.empty:
        lines += ["## Failures", "", failed[["check", "case", "detail"]].to_markdown(index=False), ""]
    for check, group in frame.groupby("check", sort=False):
        shown = group.drop(columns="check").fillna("")
        lines += [f"## {check}", "", shown.to_markdown(index=False, floatfmt=".4g"), ""]
    atomic_write(out_dir / "gpu_check.md", lambda f: f.write("\n".join(lines)), mode="w")


def _child(group: str, rows_path: Path, deadline: float, dry_run: bool) -> None:
    """Run one group here, appending each row to ``rows_path`` as one JSON line the moment it is known."""
    import torch

    from jensenkv.bench.gpu_check_context import CheckContext
    from jensenkv.bench.gpu_checks import GROUPS

    if not dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu-check needs a CUDA GPU (torch.cuda.is_available() is False); "
                         "use --dry-run to check the plumbing on a CPU")
    with rows_path.open("a") as out:
        def emit(row: dict) -> None:
            out.write(json.dumps(row) + "\n")
            out.flush()

        ctx = CheckContext(device="cpu" if dry_run else "cuda", dtype=torch.float32 if dry_run else torch.bfloat16,
                           dry_run=dry_run, deadline=deadline, emit=emit)
        GROUPS[group](ctx)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, TRITON_INTERPRET=1, float32, toy sizes: checks the plumbing")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="where gpu_check.{csv,md} go (default: results/, or outputs/gpu_check_dry_run/ with --dry-run)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for all groups together")
    parser.add_argument("--groups", nargs="+", default=list(GROUP_ORDER), help=f"a subset of {GROUP_ORDER}")
    parser.add_argument("--group", help=argparse.SUPPRESS)  # internal: run one group in this process
    parser.add_argument("--rows", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.group is not None:
        if args.group not in GROUP_ORDER:
            parser.error(f"--group={args.group!r} is not allowed: use one of {GROUP_ORDER}")
        _child(args.group, args.rows, args.deadline, args.dry_run)
        return
    unknown = [g for g in args.groups if g not in GROUP_ORDER]
    if unknown:
        parser.error(f"--groups={unknown} is not allowed: use names from {GROUP_ORDER}")
    if args.budget <= 0:
        parser.error(f"--budget={args.budget} is not allowed: it must be > 0 seconds")
    out_dir = args.out_dir or (ROOT / ("outputs/gpu_check_dry_run" if args.dry_run else "results"))
    import tempfile

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        frame = run_all(tuple(args.groups), Path(work), args.dry_run, args.budget)
    write_report(frame, out_dir, args.dry_run, time.perf_counter() - started, args.budget)
    print(f"wrote {out_dir / 'gpu_check.csv'} and {out_dir / 'gpu_check.md'} ({len(frame)} rows)", flush=True)


if __name__ == "__main__":
    main()
