"""run_imports: the CPU seconds a fresh built-in-model run spends importing, above torch's own import.

A real run (``python -X importtime -m jensenkv.run`` with the README's INT2 + Taylor settings, one prompt, PSNR,
the default offline W&B logger, into a temporary results folder) names every module it imports at top level, in
order. Then each repetition is a fresh interpreter that imports torch, then those modules, and reports the CPU
time (``time.process_time``) of each part. CPU time, not wall: other tenants of a shared machine stretch the wall
clock. The run also says whether diffusers was imported (the built-in model runs on ``models.wan.dit``).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from jensenkv.bench.plan import Plan, log_progress, row

RUN_ARGS = ("quant.bits=2", "correction=taylor", "eval.num_prompts=1", "eval.seeds=[0]", "eval.metrics=[psnr]")
_TOP_LEVEL = re.compile(r"import time:\s+\d+ \|\s+\d+ \| (\S+)$")  # one leading space: imported by the run itself

# the child: argv[1] is a JSON list of module names; prints {"torch": s, "others": s, "diffusers": bool}
_CHILD = """
import importlib, json, sys, time
start = time.process_time()
import torch
after_torch = time.process_time()
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
print(json.dumps({"torch": after_torch - start, "others": time.process_time() - after_torch,
                  "diffusers": "diffusers" in sys.modules}))
"""


def run_top_level_imports(folder: Path) -> list[str]:
    """The modules a built-in run imports at top level, in order (its ``-X importtime`` log)."""
    env = {**os.environ, "JENSENKV_RESULTS": str(folder / "results"), "WANDB_DIR": str(folder),
           "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "jensenkv.run", *RUN_ARGS,
                           f"hydra.run.dir={folder / 'hydra'}"], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the built-in run failed (exit {done.returncode}): {done.stderr.strip()[-600:]}")
    names = [m.group(1) for line in done.stderr.splitlines() if (m := _TOP_LEVEL.match(line.rstrip()))]
    return [n for n in names if n not in ("__main__", "jensenkv.run.__main__")]


def run_import_rows(plan: Plan) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="jensenkv-imports-") as tmp:
        modules = run_top_level_imports(Path(tmp))
    samples = []
    for _ in range(plan.repeats):
        out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(modules)], capture_output=True, text=True,
                             check=True)
        samples.append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = []
    for key, what in (("others", "a built-in run's imports above torch's (python -m jensenkv.run "
                       + " ".join(RUN_ARGS) + ")"), ("torch", "torch's own import")):
        values = np.array([s[key] for s in samples])
        q25, q50, q75 = np.percentile(values, [25, 50, 75])
        rows.append(row("run_imports", what, q50, "s (CPU)", q75 - q25, plan.repeats))
    rows.append(row("run_imports", "diffusers imported by a built-in run (1 = yes)",
                    float(any(s["diffusers"] for s in samples)), "bool"))
    log_progress(f"run imports: {rows[0]['value']:.2f} s CPU above torch's {rows[1]['value']:.2f} s "
                 f"({len(modules)} top-level modules)")
    return rows
