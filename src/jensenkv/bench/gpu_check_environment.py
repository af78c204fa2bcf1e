"""The ``environment`` and ``pytest`` groups of `make gpu-check`: the versions of the libraries and the device,
and the tests marked ``gpu`` run file by file (``pytest -m gpu``), one row per test.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from jensenkv.bench.gpu_check_context import GIB, CheckContext

def environment(ctx: CheckContext) -> None:
    import platform

    def versions() -> None:
        import importlib.metadata as md

        for name in ("torch", "triton", "diffusers", "hydra-core", "omegaconf", "pandas", "numpy"):
            try:
                version = md.version(name)
            except md.PackageNotFoundError:
                version = "not installed"
            ctx.add("environment", name, "measured", detail=version)
        ctx.add("environment", "python", "measured", detail=platform.python_version())

    def device() -> None:
        if ctx.device == "cuda":
            props = torch.cuda.get_device_properties(0)
            ctx.add("environment", "device", "measured", props.total_memory / GIB, "GiB",
                    detail=f"{props.name}, sm_{props.major}{props.minor}, CUDA {torch.version.cuda}, "
                           f"{props.multi_processor_count} SMs")
        else:
            ctx.add("environment", "device", "measured", detail=f"{platform.machine()} CPU, dry run "
                    "(TRITON_INTERPRET=1, float32, toy sizes: the numbers mean nothing)")

    ctx.run("environment", "versions", versions)
    ctx.run("environment", "device", device)


def gpu_test_files(tests_dir: Path) -> list[Path]:
    """The test files that hold a ``gpu``-marked test (collecting only these keeps the other files' imports,
    e.g. of packages the GPU machine lacks, out of the run)."""
    return sorted(p for p in tests_dir.rglob("test_*.py") if "pytest.mark.gpu" in p.read_text())


def pytest_gpu(ctx: CheckContext) -> None:
    """``pytest -m gpu``, one child process per test file (its timeout: what is left of the group's time, so a
    slow file costs its own rows only); one row per test from its JUnit XML, plus one row per file."""
    import os
    import subprocess
    import sys
    import tempfile
    import xml.etree.ElementTree as ET

    tests = Path(__file__).resolve().parents[3] / "tests"
    files = gpu_test_files(tests) if tests.is_dir() else []
    if not files:
        ctx.add("pytest", "pytest -m gpu", "skipped", detail=f"no test file with a gpu-marked test under {tests}")
        return

    def run(path: Path) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "junit.xml"
            started = time.perf_counter()
            try:
                done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                       f"--junitxml={report}", str(path)], cwd=tests.parent, text=True,
                                      capture_output=True, timeout=max(1.0, ctx.deadline - time.time()),
                                      env={**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"})
            except subprocess.TimeoutExpired:
                ctx.add("pytest", str(path.relative_to(tests.parent)), "failed",
                        detail=f"killed after {time.perf_counter() - started:.0f} s (the group's time budget)",
                        seconds=time.perf_counter() - started)
                return
            elapsed = time.perf_counter() - started
            for case in (ET.parse(report).getroot().iter("testcase") if report.is_file() else []):
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                outcome = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
                status = "passed" if outcome is None else ("skipped" if outcome.tag == "skipped" else "failed")
                message = "" if outcome is None else (outcome.get("message") or outcome.tag)
                ctx.add("pytest", name, status, float(case.get("time", "nan")), "s",
                        detail=(message.splitlines() or [""])[0][:300])
            tail = (done.stdout.strip().splitlines() or [""])[-1]
            ctx.add("pytest", str(path.relative_to(tests.parent)), "passed" if done.returncode in (0, 5) else "failed",
                    done.returncode, "exit code", detail=tail[:300], seconds=elapsed)

    for path in files:
        ctx.run("pytest", str(path.relative_to(tests.parent)), lambda path=path: run(path))
